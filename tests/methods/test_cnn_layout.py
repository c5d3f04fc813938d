"""The CNN classifier keeps its conv weights in channels-last order (for speed): the same function and the same
gradients as the plain layout, and a state dict that loads into either."""

from __future__ import annotations

import copy

import torch

from rlattention.engine.method import DataInfo
from rlattention.methods.cnn import CNN, CNNConfig


def make(seed: int = 0) -> CNN:
    torch.manual_seed(seed)
    info = DataInfo(image_shape=(1, 40, 40), num_classes=10)
    return CNN(CNNConfig(channels=[8, 16, 24], hidden=32), info)


def plain_copy(model: CNN) -> CNN:
    other = copy.deepcopy(model)
    other.backbone.to(memory_format=torch.contiguous_format)
    return other


def convs(model: CNN) -> list[torch.nn.Conv2d]:
    return [m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d)]


def test_conv_weights_are_channels_last_and_the_plain_copy_is_not():
    model = make()
    assert convs(model) and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs(model))
    # the first conv has one input channel: both orders are the same memory there, so only the others tell
    assert not any(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs(plain_copy(model))[1:])


def test_same_loss_gradients_and_input_gradient_as_the_plain_layout():
    model = make()
    plain = plain_copy(model)
    images = torch.rand(6, 1, 40, 40)
    targets = torch.arange(6)
    x1, x2 = images.clone().requires_grad_(), images.clone().requires_grad_()
    out1, out2 = model(x1, targets), plain(x2, targets)
    torch.testing.assert_close(out1.loss, out2.loss, rtol=1e-5, atol=1e-6)
    out1.loss.backward()
    out2.loss.backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-7)  # what a PGD attack follows
    for (name, p1), (_, p2) in zip(model.named_parameters(), plain.named_parameters(), strict=True):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-6, msg=name)
    # and the layouts really differ (the test compares two code paths, not one)
    assert model.backbone.body[4].weight.stride() != plain.backbone.body[4].weight.stride()


def test_state_dict_round_trip_between_layouts():
    model, other = make(0), make(1)
    images = torch.rand(4, 1, 40, 40)
    model.eval(), other.eval()
    other.load_state_dict({k: v.contiguous() for k, v in model.state_dict().items()})  # as a checkpoint holds it
    torch.testing.assert_close(other.predict(images), model.predict(images))
    assert other.backbone.body[4].weight.is_contiguous(memory_format=torch.channels_last)  # loading keeps the order
