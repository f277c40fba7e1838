"""NASNet-A (large 6@4032 and mobile 4@1056).

Zoph, Vasudevan, Shlens, Le, "Learning Transferable Architectures for Scalable Image Recognition",
CVPR 2018 (arXiv:1707.07012), Figure 4 (NASNet-A normal and reduction cells) and Table 2 / Appendix
(ImageNet models: NASNet-A (6 @ 4032), 331 px, and NASNet-A (4 @ 1056), 224 px).

The layout follows the TensorFlow reference (``tensorflow/models/research/slim/nets/nasnet``) and its
widely used PyTorch port (Cadene, ``pretrainedmodels/models/nasnet.py`` / ``nasnet_mobile.py``):

* ``conv0``: 3x3/2 conv (valid padding), ``stem_filters`` channels + BN (no ReLU).
* two stem cells (reduction cells with ``filters/4`` and ``filters/2`` filters, ``filters =
  penultimate_filters / 24``); the second one reads ``conv0`` through a factorized reduction.
* three stages of N normal cells with ``filters``, ``2 filters``, ``4 filters``, separated by two
  reduction cells (x2 filters each).
* ReLU, global average pool, (dropout), fully connected.

Cells (inputs ``x`` = previous cell output, ``h`` = the one before it; "sep k" = ReLU -> k x k depthwise
-> 1x1 -> BN, twice, the first one carrying the stride; BN is folded into the pointwise conv):

* every cell first maps both inputs to F channels: ``x`` by ReLU -> 1x1 conv -> BN; ``h`` the same way
  if it has x's resolution, else by a *factorized reduction* (ReLU, then two paths: 1x1/2 avg pool ->
  1x1 conv F/2, and shift-by-one (pad bottom/right, drop first row/col) -> 1x1/2 avg pool -> 1x1 conv F/2;
  concatenated, BN folded into each conv).
* normal cell (output concat of h', c0..c4 = 6F channels):
  c0 = sep5(x') + sep3(h'); c1 = sep5(h') + sep3(h'); c2 = avg3(x') + h'; c3 = avg3(h') + avg3(h');
  c4 = sep3(x') + x'.
* reduction cell (output concat of c1..c4 = 4F channels, stride 2):
  c0 = sep5/2(x') + sep7/2(h'); c1 = max3/2(x') + sep7/2(h'); c2 = avg3/2(x') + sep5/2(h');
  c3 = avg3(c0) + c1; c4 = sep3(c0) + max3/2(x').
* stem cell 0 is a reduction cell whose ``h`` is conv0 itself, without the 1x1 (its sep7/sep5 branches
  on conv0 go straight from ``stem_filters`` to F channels), as in the reference.

Which earlier output a cell reads as ``h`` follows the reference: for the large model
(``skip_reduction_layer_input=1``) the first normal cell after a reduction reads the output from *before*
the reduction's own input; for the mobile model it reads the reduction's input.

Simplifications (documented): all stride-2 ops use TensorFlow "SAME" padding (output ceil(n/2); the
Cadene port emulates exactly this with its ZeroPad2d + crop tricks for even sizes and uses symmetric
padding for odd sizes, which coincides with SAME; the only deviation is the mobile model's second stem
cell at 56 px, where Cadene uses symmetric padding); average pools do not count padding; no drop-path,
no auxiliary head; at tiny ``width`` every cell has at least 2 filters (the factorized reduction splits
them in two). ``depth`` sets N (normal cells per stage).
"""

from __future__ import annotations

from .layers import NetBuilder, T, same_padding

# name -> (stem_filters, penultimate_filters, cells per stage N, skip_reduction_layer_input)
CONFIGS = {
    "nasnet_a_large": (96, 4032, 6, True),
    "nasnet_a_mobile": (32, 1056, 4, False),
}
DEFAULT_IMAGE_SIZE = {"nasnet_a_large": 331, "nasnet_a_mobile": 224}
MIN_IMAGE_SIZE = 3


def _same4(x: T, k: int, s: int):
    """(top, left, bottom, right) padding: TF SAME for stride 2, symmetric k // 2 for stride 1."""
    if s == 1:
        return (k // 2,) * 4
    ph = same_padding(x.hw[0], k, s)
    pw = same_padding(x.hw[1], k, s)
    return ph[0], pw[0], ph[1], pw[1]


def _relu_conv_bn(nb: NetBuilder, x: T, c: int) -> T:
    return nb.conv(nb.relu(x), c, 1)


def _sep(nb: NetBuilder, x: T, c: int, k: int, s: int = 1) -> T:
    """Two stacked (ReLU -> separable conv -> BN); the first one has the stride."""
    y = nb.sep_conv(nb.relu(x), c, k, s, _same4(x, k, s))
    return nb.sep_conv(nb.relu(y), c, k, 1, _same4(y, k, 1))


def _max3(nb: NetBuilder, x: T, s: int) -> T:
    return nb.max_pool(x, 3, s, _same4(x, 3, s))


def _avg3(nb: NetBuilder, x: T, s: int) -> T:
    return nb.avg_pool(x, 3, s, _same4(x, 3, s), count_include_pad=False)


def _factorized_reduction(nb: NetBuilder, x: T, c: int) -> T:
    """ReLU, then two 1x1/2 avg-pool -> 1x1 conv paths (the second shifted by one pixel), concat."""
    x = nb.relu(x)
    p1 = nb.conv(nb.avg_pool(x, 1, 2), c // 2, 1)
    shifted = nb.slice_hw(nb.pad(x, 0, 0, 1, 1), (1, 1), (1, 1))
    p2 = nb.conv(nb.avg_pool(shifted, 1, 2), c - c // 2, 1)
    return nb.concat([p1, p2])


def _prep_prev(nb: NetBuilder, h: T, x: T, c: int) -> T:
    if h.hw != x.hw:
        return _factorized_reduction(nb, h, c)
    return _relu_conv_bn(nb, h, c)


def normal_cell(nb: NetBuilder, x: T, h: T, c: int) -> T:
    hp = _prep_prev(nb, h, x, c)
    xp = _relu_conv_bn(nb, x, c)
    c0 = nb.add(_sep(nb, xp, c, 5), _sep(nb, hp, c, 3))
    c1 = nb.add(_sep(nb, hp, c, 5), _sep(nb, hp, c, 3))
    c2 = nb.add(_avg3(nb, xp, 1), hp)
    c3 = nb.add(_avg3(nb, hp, 1), _avg3(nb, hp, 1))
    c4 = nb.add(_sep(nb, xp, c, 3), xp)
    return nb.concat([hp, c0, c1, c2, c3, c4])


def reduction_cell(nb: NetBuilder, x: T, h: T | None, c: int) -> T:
    """Reduction cell. ``h=None`` is stem cell 0: its ``h`` is ``x`` itself (conv0) without a 1x1."""
    if h is None:
        hp = x
        xp = _relu_conv_bn(nb, x, c)
    else:
        xp = _relu_conv_bn(nb, x, c)
        hp = _prep_prev(nb, h, x, c)
    c0 = nb.add(_sep(nb, xp, c, 5, 2), _sep(nb, hp, c, 7, 2))
    c1 = nb.add(_max3(nb, xp, 2), _sep(nb, hp, c, 7, 2))
    c2 = nb.add(_avg3(nb, xp, 2), _sep(nb, hp, c, 5, 2))
    c3 = nb.add(_avg3(nb, c0, 1), c1)
    c4 = nb.add(_sep(nb, c0, c, 3), _max3(nb, xp, 2))
    return nb.concat([c1, c2, c3, c4])


def make_body(name: str):
    stem_filters, penultimate, n_default, skip = CONFIGS[name]

    def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
        n = n_default if depth is None else depth
        filters = penultimate // 24

        def fch(c: float) -> int:  # cell filter count, >= 2 for the two factorized-reduction paths
            return max(2, nb.ch(c))

        conv0 = nb.conv(x, nb.ch(stem_filters), 3, 2, 0)
        stem0 = reduction_cell(nb, conv0, None, fch(filters / 4))
        stem1 = reduction_cell(nb, stem0, conv0, fch(filters / 2))
        outputs = [conv0, stem0, stem1]
        net = stem1
        scale = 1
        for cell_num in range(3 * n):
            prev = outputs[-2]
            if cell_num in (n, 2 * n):
                scale *= 2
                net = reduction_cell(nb, net, outputs[-2], fch(filters * scale))
                outputs.append(net)
                if not skip:
                    prev = outputs[-2]
            net = normal_cell(nb, net, prev, fch(filters * scale))
            outputs.append(net)
        x = nb.global_avg_pool(nb.relu(net))
        return nb.dense(x, nb.num_classes)

    return body
