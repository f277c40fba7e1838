"""GoogLeNet (Inception-v1).

Szegedy, Liu, Jia, Sermanet, Reed, Anguelov, Erhan, Vanhoucke, Rabinovich, "Going Deeper with
Convolutions", CVPR 2015 (arXiv:1409.4842), Table 1.

Structure (as in the paper: convs with bias + ReLU, no BatchNorm; the two LRN layers are omitted, as
in torchvision; no auxiliary classifiers, they are training-only):

* 7x7/2 conv 64, 3x3/2 max pool, 1x1 conv 64, 3x3 conv 192, 3x3/2 max pool
* inception 3a, 3b, 3x3/2 max pool
* inception 4a, 4b, 4c, 4d, 4e, 3x3/2 max pool
* inception 5a, 5b
* global average pool (the paper's 7x7 avg pool at 224 px), (dropout), fully connected.

Inception module (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj) = four branches concatenated:
1x1 conv | 1x1 conv -> 3x3 conv | 1x1 conv -> 5x5 conv | 3x3/1 max pool -> 1x1 conv. All max pools
between stages use PyTorch's ceil mode (``ceil_mode=True`` as torchvision), written as floor-mode pools
with an extra trailing -inf row/column.
"""

from __future__ import annotations

from .layers import NetBuilder, T

DEFAULT_IMAGE_SIZE = 224
MIN_IMAGE_SIZE = 47

# name: (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj)
MODULES = [
    ("3a", (64, 96, 128, 16, 32, 32)),
    ("3b", (128, 128, 192, 32, 96, 64)),
    "pool",
    ("4a", (192, 96, 208, 16, 48, 64)),
    ("4b", (160, 112, 224, 24, 64, 64)),
    ("4c", (128, 128, 256, 24, 64, 64)),
    ("4d", (112, 144, 288, 32, 64, 64)),
    ("4e", (256, 160, 320, 32, 128, 128)),
    "pool",
    ("5a", (256, 160, 320, 32, 128, 128)),
    ("5b", (384, 192, 384, 48, 128, 128)),
]


def _conv(nb: NetBuilder, x: T, c: int, k: int, s: int = 1) -> T:
    return nb.conv(x, nb.ch(c), k, s, k // 2, norm="lsuv", relu=True)


def _inception(nb: NetBuilder, x: T, cfg) -> T:
    c1, r3, c3, r5, c5, pp = cfg
    b1 = _conv(nb, x, c1, 1)
    b2 = _conv(nb, _conv(nb, x, r3, 1), c3, 3)
    b3 = _conv(nb, _conv(nb, x, r5, 1), c5, 5)
    b4 = _conv(nb, nb.max_pool(x, 3, 1, 1), pp, 1)
    return nb.concat([b1, b2, b3, b4])


def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
    x = _conv(nb, x, 64, 7, 2)
    x = nb.max_pool_ceil(x, 3, 2)
    x = _conv(nb, x, 64, 1)
    x = _conv(nb, x, 192, 3)
    x = nb.max_pool_ceil(x, 3, 2)
    for m in MODULES:
        x = nb.max_pool_ceil(x, 3, 2) if m == "pool" else _inception(nb, x, m[1])
    x = nb.global_avg_pool(x)
    return nb.dense(x, nb.num_classes)
