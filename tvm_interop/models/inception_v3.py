"""Inception-v3.

Szegedy, Vanhoucke, Ioffe, Shlens, Wojna, "Rethinking the Inception Architecture for Computer Vision",
CVPR 2016 (arXiv:1512.00567), Table 1 / Figures 5-7, in torchvision's ``inception_v3`` layout (no
auxiliary head, ``transform_input=False``).

Every conv is torchvision's ``BasicConv2d``: conv (no bias) + BatchNorm (folded into a bias) + ReLU.

* stem: 3x3/2 conv 32 (valid), 3x3 conv 32 (valid), 3x3 conv 64 (pad 1), 3x3/2 max pool, 1x1 conv 80,
  3x3 conv 192 (valid), 3x3/2 max pool
* 3x InceptionA (Mixed_5b/5c/5d, pool features 32, 64, 64): 1x1 64 | 1x1 48 -> 5x5 64 |
  1x1 64 -> 3x3 96 -> 3x3 96 | 3x3/1 avg pool -> 1x1 pool_features
* InceptionB (Mixed_6a, grid reduction): 3x3/2 conv 384 | 1x1 64 -> 3x3 96 -> 3x3/2 96 | 3x3/2 max pool
* 4x InceptionC (Mixed_6b..6e, c7 = 128, 160, 160, 192): 1x1 192 | 1x1 c7 -> 1x7 c7 -> 7x1 192 |
  1x1 c7 -> 7x1 c7 -> 1x7 c7 -> 7x1 c7 -> 1x7 192 | 3x3/1 avg pool -> 1x1 192
* InceptionD (Mixed_7a, grid reduction): 1x1 192 -> 3x3/2 320 | 1x1 192 -> 1x7 192 -> 7x1 192 ->
  3x3/2 192 | 3x3/2 max pool
* 2x InceptionE (Mixed_7b/7c): 1x1 320 | 1x1 384 -> (1x3 384 | 3x1 384) | 1x1 448 -> 3x3 384 ->
  (1x3 384 | 3x1 384) | 3x3/1 avg pool -> 1x1 192
* global average pool, (dropout), fully connected.

The 3x3/1 average pools count the padding (PyTorch's default ``count_include_pad=True``).
``depth`` caps each group of repeated modules: A x min(3, d), C x min(4, d), E x min(2, d) (the first
modules of each group are kept).
"""

from __future__ import annotations

from .layers import NetBuilder, T

DEFAULT_IMAGE_SIZE = 299
MIN_IMAGE_SIZE = 75

A_POOL_FEATURES = (32, 64, 64)
C_CHANNELS_7X7 = (128, 160, 160, 192)
E_COUNT = 2


def _c(nb: NetBuilder, x: T, c: int, k=1, s=1, p=0) -> T:
    return nb.conv(x, nb.ch(c), k, s, p, relu=True)


def _pool_branch(nb: NetBuilder, x: T, c: int) -> T:
    return _c(nb, nb.avg_pool(x, 3, 1, 1, count_include_pad=True), c)


def inception_a(nb: NetBuilder, x: T, pool_features: int) -> T:
    b1 = _c(nb, x, 64)
    b5 = _c(nb, _c(nb, x, 48), 64, 5, 1, 2)
    b3 = _c(nb, _c(nb, _c(nb, x, 64), 96, 3, 1, 1), 96, 3, 1, 1)
    return nb.concat([b1, b5, b3, _pool_branch(nb, x, pool_features)])


def inception_b(nb: NetBuilder, x: T) -> T:
    b3 = _c(nb, x, 384, 3, 2)
    bd = _c(nb, _c(nb, _c(nb, x, 64), 96, 3, 1, 1), 96, 3, 2)
    return nb.concat([b3, bd, nb.max_pool(x, 3, 2)])


def inception_c(nb: NetBuilder, x: T, c7: int) -> T:
    b1 = _c(nb, x, 192)
    b7 = _c(nb, x, c7)
    b7 = _c(nb, b7, c7, (1, 7), 1, (0, 3))
    b7 = _c(nb, b7, 192, (7, 1), 1, (3, 0))
    bd = _c(nb, x, c7)
    bd = _c(nb, bd, c7, (7, 1), 1, (3, 0))
    bd = _c(nb, bd, c7, (1, 7), 1, (0, 3))
    bd = _c(nb, bd, c7, (7, 1), 1, (3, 0))
    bd = _c(nb, bd, 192, (1, 7), 1, (0, 3))
    return nb.concat([b1, b7, bd, _pool_branch(nb, x, 192)])


def inception_d(nb: NetBuilder, x: T) -> T:
    b3 = _c(nb, _c(nb, x, 192), 320, 3, 2)
    b7 = _c(nb, x, 192)
    b7 = _c(nb, b7, 192, (1, 7), 1, (0, 3))
    b7 = _c(nb, b7, 192, (7, 1), 1, (3, 0))
    b7 = _c(nb, b7, 192, 3, 2)
    return nb.concat([b3, b7, nb.max_pool(x, 3, 2)])


def inception_e(nb: NetBuilder, x: T) -> T:
    b1 = _c(nb, x, 320)
    b3 = _c(nb, x, 384)
    b3 = nb.concat([_c(nb, b3, 384, (1, 3), 1, (0, 1)), _c(nb, b3, 384, (3, 1), 1, (1, 0))])
    bd = _c(nb, _c(nb, x, 448), 384, 3, 1, 1)
    bd = nb.concat([_c(nb, bd, 384, (1, 3), 1, (0, 1)), _c(nb, bd, 384, (3, 1), 1, (1, 0))])
    return nb.concat([b1, b3, bd, _pool_branch(nb, x, 192)])


def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
    cap = (lambda n: n) if depth is None else (lambda n: min(n, depth))
    x = _c(nb, x, 32, 3, 2)
    x = _c(nb, x, 32, 3)
    x = _c(nb, x, 64, 3, 1, 1)
    x = nb.max_pool(x, 3, 2)
    x = _c(nb, x, 80)
    x = _c(nb, x, 192, 3)
    x = nb.max_pool(x, 3, 2)
    for pf in A_POOL_FEATURES[: cap(len(A_POOL_FEATURES))]:
        x = inception_a(nb, x, pf)
    x = inception_b(nb, x)
    for c7 in C_CHANNELS_7X7[: cap(len(C_CHANNELS_7X7))]:
        x = inception_c(nb, x, c7)
    x = inception_d(nb, x)
    for _ in range(cap(E_COUNT)):
        x = inception_e(nb, x)
    x = nb.global_avg_pool(x)
    return nb.dense(x, nb.num_classes)
