"""Model zoo: image classifiers built directly in Relax, with seeded random weights, in inference form.

>>> from tvm_interop.models import get_model, list_models
>>> mod = get_model("squeezenet", width=0.25, image_size=64)   # IRModule with main(data) -> logits

Every model is a Relax function ``main`` with one parameter ``data`` (float32, NCHW ``(B, 3, H, W)``,
H = W = ``image_size``) returning the logits ``(B, num_classes)``. Weights are ``relax.const`` numpy
arrays drawn from ``numpy.random.default_rng(seed)``; BatchNorm is folded into the preceding conv (or
absent, for the models that have none). See :mod:`tvm_interop.models.layers` for how the weights are
scaled so the activations stay O(1).

Arguments of :func:`get_model`: ``width`` multiplies every channel count (``max(1, round(c * width))``),
``image_size`` sets H = W (default: the paper's), ``depth`` shrinks the repeated part of the model
(see each model's ``depth_param``; ``None`` = the paper's value).

:func:`build_with_reference` also returns a seeded probe image and the builder's own numpy forward pass
on it (an independent reference for checking what TVM computes).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import tvm

from . import googlenet, inception_v3, nasnet, randwire, resnet, squeezenet
from .layers import ImageTooSmall, NetBuilder

__all__ = ["ModelSpec", "MODELS", "list_models", "get_model", "input_shape", "build_with_reference", "ImageTooSmall"]


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the zoo.

    ``build(batch_size, image_size, width, num_classes, seed, depth) -> IRModule`` (arguments already
    validated; prefer :func:`get_model`). ``depth_param`` says what ``depth`` controls (``None``: the model
    has no repeat count and ``depth`` must be left ``None``). ``min_image_size`` is the smallest H = W the
    network accepts; ``min_depth`` the smallest ``depth``.
    """

    name: str
    build: Callable[..., tvm.IRModule]
    default_image_size: int
    description: str
    source: str
    depth_param: str | None
    min_image_size: int = 1
    min_depth: int = 1


def _builder(name: str, body, batch_size, image_size, width, num_classes, seed, depth, *, with_probe=False):
    nb = NetBuilder(
        name, batch_size=batch_size, image_size=image_size, width=width, num_classes=num_classes, seed=seed
    )
    mod = nb.run(lambda b, x: body(b, x, depth))
    if with_probe:
        return mod, nb
    return mod


def _spec(name, body, default_image_size, description, source, depth_param, min_image_size, min_depth=1):
    return ModelSpec(
        name=name,
        build=partial(_builder, name, body),
        default_image_size=default_image_size,
        description=description,
        source=source,
        depth_param=depth_param,
        min_image_size=min_image_size,
        min_depth=min_depth,
    )


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        _spec(
            "inception_v3",
            inception_v3.body,
            inception_v3.DEFAULT_IMAGE_SIZE,
            "Inception-v3 (torchvision layout, no aux head): stem, 3x InceptionA, InceptionB, 4x InceptionC, "
            "InceptionD, 2x InceptionE, global avg pool, fc",
            'C. Szegedy, V. Vanhoucke, S. Ioffe, J. Shlens, Z. Wojna, "Rethinking the Inception Architecture '
            'for Computer Vision", CVPR 2016, arXiv:1512.00567',
            "repeated Inception modules: A x min(3, depth), C x min(4, depth), E x min(2, depth)",
            inception_v3.MIN_IMAGE_SIZE,
        ),
        _spec(
            "randwire",
            randwire.body,
            randwire.DEFAULT_IMAGE_SIZE,
            "RandWire-WS(4, 0.75), small regime, C=78: conv1, conv2, 3 random-graph stages of N=32 "
            "ReLU-SepConv3x3-BN nodes, 1x1 conv 1280, global avg pool, fc",
            'S. Xie, A. Kirillov, R. Girshick, K. He, "Exploring Randomly Wired Neural Networks for Image '
            'Recognition", ICCV 2019, arXiv:1904.01569',
            "N, nodes per random-graph stage (paper: 32; at least K+1 = 5)",
            randwire.MIN_IMAGE_SIZE,
            min_depth=randwire.K + 1,
        ),
        _spec(
            "nasnet_a_large",
            nasnet.make_body("nasnet_a_large"),
            nasnet.DEFAULT_IMAGE_SIZE["nasnet_a_large"],
            "NASNet-A (6 @ 4032): conv0, 2 stem cells, 3 stages of N=6 normal cells with 2 reduction cells, "
            "global avg pool, fc",
            'B. Zoph, V. Vasudevan, J. Shlens, Q. V. Le, "Learning Transferable Architectures for Scalable '
            'Image Recognition", CVPR 2018, arXiv:1707.07012',
            "N, normal cells per stage (paper: 6)",
            nasnet.MIN_IMAGE_SIZE,
        ),
        _spec(
            "nasnet_a_mobile",
            nasnet.make_body("nasnet_a_mobile"),
            nasnet.DEFAULT_IMAGE_SIZE["nasnet_a_mobile"],
            "NASNet-A (4 @ 1056): conv0, 2 stem cells, 3 stages of N=4 normal cells with 2 reduction cells, "
            "global avg pool, fc",
            'B. Zoph, V. Vasudevan, J. Shlens, Q. V. Le, "Learning Transferable Architectures for Scalable '
            'Image Recognition", CVPR 2018, arXiv:1707.07012',
            "N, normal cells per stage (paper: 4)",
            nasnet.MIN_IMAGE_SIZE,
        ),
        _spec(
            "squeezenet",
            squeezenet.body,
            squeezenet.DEFAULT_IMAGE_SIZE,
            "SqueezeNet v1.1: 3x3/2 conv, 8 fire modules with 3 max pools, 1x1 conv classifier, "
            "global avg pool, flatten",
            'F. N. Iandola, S. Han, M. W. Moskewicz, K. Ashraf, W. J. Dally, K. Keutzer, "SqueezeNet: '
            'AlexNet-level accuracy with 50x fewer parameters and <0.5MB model size", arXiv:1602.07360, 2016 '
            "(v1.1 from the authors' repository)",
            None,
            squeezenet.MIN_IMAGE_SIZE,
        ),
        _spec(
            "resnet50",
            resnet.body,
            resnet.DEFAULT_IMAGE_SIZE,
            "ResNet-50 (v1.5, torchvision layout): 7x7/2 conv, max pool, bottleneck blocks [3, 4, 6, 3], "
            "global avg pool, fc",
            'K. He, X. Zhang, S. Ren, J. Sun, "Deep Residual Learning for Image Recognition", CVPR 2016, '
            "arXiv:1512.03385",
            "bottleneck blocks per stage: [min(3, depth), min(4, depth), min(6, depth), min(3, depth)]",
            resnet.MIN_IMAGE_SIZE,
        ),
        _spec(
            "googlenet",
            googlenet.body,
            googlenet.DEFAULT_IMAGE_SIZE,
            "GoogLeNet / Inception-v1: stem, 9 inception modules (3a-5b) with max pools, global avg pool, "
            "fc (no aux heads, no LRN)",
            'C. Szegedy, W. Liu, Y. Jia, P. Sermanet, S. Reed, D. Anguelov, D. Erhan, V. Vanhoucke, '
            'A. Rabinovich, "Going Deeper with Convolutions", CVPR 2015, arXiv:1409.4842',
            None,
            googlenet.MIN_IMAGE_SIZE,
        ),
    ]
}


def small_config(name: str) -> dict:
    """``get_model`` keywords for a narrow, small, shallow version of ``name`` that keeps its structure (32 px
    reaches NASNet's factorized reduction): what the test suite and quick checks build, in seconds."""
    spec = _spec_of(name)
    cfg = {"width": 0.125, "image_size": max(spec.min_image_size, 32)}
    if spec.depth_param is not None:
        cfg["depth"] = spec.min_depth
    return cfg


def list_models() -> list[str]:
    """Names of the registered models, sorted."""
    return sorted(MODELS)


def _spec_of(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; available models: {', '.join(list_models())}") from None


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_int(what: str, v, minimum: int) -> int:
    if not _is_int(v):
        raise ValueError(f"{what} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return int(v)


def _resolve_image_size(spec: ModelSpec, image_size) -> int:
    if image_size is None:
        return spec.default_image_size
    size = _check_int("image_size", image_size, 1)
    if size < spec.min_image_size:
        raise ValueError(
            f"image_size={size} is too small for {spec.name}: the smallest input it accepts is "
            f"{spec.min_image_size}x{spec.min_image_size} (default {spec.default_image_size})"
        )
    return size


def _validate(name, batch_size, image_size, width, num_classes, seed, depth):
    spec = _spec_of(name)
    batch_size = _check_int("batch_size", batch_size, 1)
    size = _resolve_image_size(spec, image_size)
    if isinstance(width, bool) or not isinstance(width, numbers.Real) or not math.isfinite(width) or width <= 0:
        raise ValueError(f"width must be a finite number > 0, got {width!r}")
    num_classes = _check_int("num_classes", num_classes, 1)
    seed = _check_int("seed", seed, 0)
    if depth is not None:
        if spec.depth_param is None:
            raise ValueError(f"{spec.name} has no repeat count: depth must be None, got {depth!r}")
        depth = _check_int(f"depth ({spec.depth_param})", depth, spec.min_depth)
    return spec, batch_size, size, float(width), num_classes, seed, depth


def get_model(
    name: str,
    batch_size: int = 1,
    image_size: int | None = None,
    width: float = 1.0,
    num_classes: int = 1000,
    seed: int = 0,
    depth: int | None = None,
) -> tvm.IRModule:
    """Build ``name`` as a Relax IRModule with ``main(data: (B, 3, S, S) float32) -> (B, num_classes)``.

    Raises ``ValueError`` for an unknown name or bad arguments (batch < 1, width <= 0, image smaller than
    the model's ``min_image_size``, depth for a model without a repeat count, ...).
    """
    spec, batch_size, size, width, num_classes, seed, depth = _validate(
        name, batch_size, image_size, width, num_classes, seed, depth
    )
    return spec.build(batch_size, size, width, num_classes, seed, depth)


def build_with_reference(name: str, **kwargs) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    """Like :func:`get_model`, also returning the builder's numpy probe: ``(mod, x, logits)`` where
    ``x`` is a seeded (1, 3, S, S) input and ``logits`` the numpy reference output of the network on it
    (batch 1 only; used by the tests to check the Relax graph against an independent implementation)."""
    args = dict(batch_size=1, image_size=None, width=1.0, num_classes=1000, seed=0, depth=None)
    unknown = set(kwargs) - set(args)
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}")
    args.update(kwargs)
    spec, batch_size, size, width, num_classes, seed, depth = _validate(name, **args)
    if batch_size != 1:
        raise ValueError("build_with_reference supports batch_size=1 only")
    mod, nb = spec.build(batch_size, size, width, num_classes, seed, depth, with_probe=True)
    return mod, nb.probe_input, nb.probe_output


def input_shape(name: str, batch_size: int = 1, image_size: int | None = None) -> tuple[int, int, int, int]:
    """The ``data`` shape ``(B, 3, H, W)`` of ``get_model(name, batch_size, image_size)``."""
    spec = _spec_of(name)
    batch_size = _check_int("batch_size", batch_size, 1)
    size = _resolve_image_size(spec, image_size)
    return (batch_size, 3, size, size)
