"""Attention figures: every map on one colour scale with one colourbar (issue 21's figure requirement)."""

from __future__ import annotations

import pytest
import torch

from rlattention.vision.plot import ATTENTION_CMAP, attention_overlay_figure, attention_range, plot_reid_ranking


def _attention_images(fig):
    return [
        im
        for ax in fig.axes
        for im in ax.get_images()
        if im.get_array().ndim == 2 and im.get_cmap().name == ATTENTION_CMAP  # not the (RGB or grey) images
    ]


def test_maps_of_different_ranges_share_one_scale_and_one_colourbar():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 1, 16, 16), dtype=torch.uint8, generator=g)
    narrow = 0.4 + 0.05 * torch.rand(2, 3, 16, 16, generator=g)  # 0.40-0.45
    wide = torch.rand(2, 2, 16, 16, generator=g) * 0.9  # 0-0.9
    fig = attention_overlay_figure(images, {"weak": narrow, "self_critical": wide})
    shown = _attention_images(fig)
    assert len(shown) == 2 * 3 + 2 * 2
    assert len({(im.norm.vmin, im.norm.vmax) for im in shown}) == 1
    assert shown[0].norm.vmin == pytest.approx(float(min(narrow.min(), wide.min())))
    assert shown[0].norm.vmax == pytest.approx(float(max(narrow.max(), wide.max())))
    # exactly one colourbar: one extra axes beyond the image grid
    assert len(fig.axes) == 4 * 4 + 1


def test_a_given_range_is_used_as_is():
    images = torch.zeros(1, 3, 8, 8)
    fig = attention_overlay_figure(images, {"a": torch.full((1, 2, 8, 8), 0.3)}, vrange=(0.0, 1.0))
    assert {(im.norm.vmin, im.norm.vmax) for im in _attention_images(fig)} == {(0.0, 1.0)}


def test_bad_shapes_and_ranges_are_named():
    images = torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match="maps\\['a'\\]"):
        attention_overlay_figure(images, {"a": torch.zeros(2, 1, 4, 4)})
    with pytest.raises(ValueError, match="at least one"):
        attention_overlay_figure(images, {})
    with pytest.raises(ValueError, match="vrange"):
        attention_range([torch.zeros(2)], (1.0, 0.0))


def test_reid_ranking_figure_is_written(tmp_path):
    path = plot_reid_ranking(
        torch.zeros(1, 8, 8),
        torch.rand(3, 8, 8),
        torch.zeros(4, 1, 8, 8),
        [True, False, False, True],
        tmp_path / "q.png",
        module_names=["att0", "att1", "att2"],
    )
    assert path.is_file() and path.stat().st_size > 0
