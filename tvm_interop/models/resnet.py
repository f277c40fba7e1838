"""ResNet-50.

He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016 (arXiv:1512.03385),
Table 1, 50-layer column, in the torchvision layout ("ResNet v1.5": the stride-2 of a down-sampling
bottleneck sits on its 3x3 conv).

Structure (every conv is conv + BatchNorm folded into a bias):

* stem: 7x7/2 conv 64 + ReLU, 3x3/2 max pool (padding 1)
* 4 stages of bottleneck blocks, [3, 4, 6, 3] blocks, widths 64/128/256/512, expansion 4; the first
  block of stages 2-4 has stride 2. Block: 1x1 conv + ReLU -> 3x3 conv (stride s) + ReLU -> 1x1 conv
  (x4 channels); shortcut = identity, or 1x1 conv (stride s) + BN on the first block of each stage;
  out = ReLU(branch + shortcut).
* global average pool, fully connected layer.

``depth`` caps the number of blocks of every stage: ``[min(3, d), min(4, d), min(6, d), min(3, d)]``.
"""

from __future__ import annotations

from .layers import NetBuilder, T

BLOCKS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
DEFAULT_IMAGE_SIZE = 224
MIN_IMAGE_SIZE = 1


def _bottleneck(nb: NetBuilder, x: T, width: int, stride: int, downsample: bool) -> T:
    out_c = nb.ch(width * EXPANSION)
    y = nb.conv(x, nb.ch(width), 1, relu=True)
    y = nb.conv(y, nb.ch(width), 3, stride, relu=True)
    y = nb.conv(y, out_c, 1)
    shortcut = nb.conv(x, out_c, 1, stride) if downsample else x
    return nb.relu(nb.add(y, shortcut))


def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
    blocks = BLOCKS if depth is None else tuple(min(n, depth) for n in BLOCKS)
    x = nb.conv(x, nb.ch(64), 7, 2, 3, relu=True)
    x = nb.max_pool(x, 3, 2, 1)
    for stage, (n, width) in enumerate(zip(blocks, WIDTHS)):
        for i in range(n):
            stride = 2 if (stage > 0 and i == 0) else 1
            x = _bottleneck(nb, x, width, stride, downsample=(i == 0))
    x = nb.global_avg_pool(x)
    return nb.dense(x, nb.num_classes)
