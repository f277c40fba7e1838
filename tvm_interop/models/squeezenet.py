"""SqueezeNet v1.1.

Iandola, Han, Moskewicz, Ashraf, Dally, Keutzer, "SqueezeNet: AlexNet-level accuracy with 50x fewer
parameters and <0.5MB model size", arXiv:1602.07360 (2016); v1.1 is the revision published in the
authors' repository (forresti/SqueezeNet) and used by torchvision's ``squeezenet1_1``.

Structure (no BatchNorm: every conv has a bias and is followed by ReLU):

* 3x3/2 conv 64 (no padding), 3x3/2 max pool (ceil mode)
* fire2 (16, 64, 64), fire3 (16, 64, 64), 3x3/2 max pool (ceil)
* fire4 (32, 128, 128), fire5 (32, 128, 128), 3x3/2 max pool (ceil)
* fire6 (48, 192, 192), fire7 (48, 192, 192), fire8 (64, 256, 256), fire9 (64, 256, 256)
* classifier: (dropout) 1x1 conv to num_classes + ReLU, global average pool, flatten.

Fire(s, e1, e3): 1x1 squeeze conv s + ReLU, then in parallel 1x1 expand e1 + ReLU and 3x3 expand e3
(padding 1) + ReLU, concatenated. Ceil-mode pools are written as floor-mode pools with an extra trailing
padding row/column of -inf (identical results).
"""

from __future__ import annotations

from .layers import NetBuilder, T

DEFAULT_IMAGE_SIZE = 224
MIN_IMAGE_SIZE = 25

FIRES = [(16, 64, 64), (16, 64, 64), "pool", (32, 128, 128), (32, 128, 128), "pool",
         (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256)]  # fmt: skip


def _fire(nb: NetBuilder, x: T, squeeze: int, e1: int, e3: int) -> T:
    s = nb.conv(x, nb.ch(squeeze), 1, norm="lsuv", relu=True)
    a = nb.conv(s, nb.ch(e1), 1, norm="lsuv", relu=True)
    b = nb.conv(s, nb.ch(e3), 3, 1, 1, norm="lsuv", relu=True)
    return nb.concat([a, b])


def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
    x = nb.conv(x, nb.ch(64), 3, 2, 0, norm="lsuv", relu=True)
    x = nb.max_pool_ceil(x, 3, 2)
    for f in FIRES:
        x = nb.max_pool_ceil(x, 3, 2) if f == "pool" else _fire(nb, x, *f)
    # classifier: the final conv outputs the classes (not width-scaled)
    x = nb.conv(x, nb.num_classes, 1, norm="lsuv", relu=True)
    x = nb.global_avg_pool_2d(x)
    return nb.flatten(x)
