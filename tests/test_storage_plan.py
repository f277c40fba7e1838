"""Storage sharing of the worker-thread executor's plan (``runtime.plan.assign_storage``)."""
import numpy as np

from tvm_interop.runtime.plan import _best_fit_storage, _same_shape_storage, assign_storage, tensor_nbytes


def _total(buffers, ids):
    most = {}
    for b, sid in zip(buffers, ids):
        most[sid] = max(most.get(sid, 0), tensor_nbytes(b["shape"], b["dtype"]))
    return sum(most.values())


def test_buffers_share_storage_only_when_their_stages_are_disjoint_and_never_grow_memory():
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        buffers = [{"shape": [int(rng.integers(1, 5)), int(rng.choice([1, 2, 8, 16]))],
                    "dtype": str(rng.choice(["float32", "float16", "int8"]))} for _ in range(n)]
        live = []
        for _ in range(n):
            a = int(rng.integers(0, 20))
            live.append((a, a + int(rng.integers(0, 6))))
        assign_storage(buffers, live)
        ids = [b["storage"] for b in buffers]
        for i in range(n):
            for j in range(i + 1, n):
                if ids[i] == ids[j]:   # one storage: their stage intervals must not meet
                    assert live[i][1] < live[j][0] or live[j][1] < live[i][0], (trial, i, j)
        # the kept assignment is the smaller of the two, so never more memory than one class per shape
        assert _total(buffers, ids) == min(_total(buffers, _same_shape_storage(buffers, live)),
                                           _total(buffers, _best_fit_storage([tensor_nbytes(b["shape"], b["dtype"])
                                                                              for b in buffers], live)))


def test_buffers_of_different_shapes_share_one_storage():
    """A chain of differently shaped tensors, each read only by the next stage: two storages suffice."""
    buffers = [{"shape": [1, 8 * (k + 1)], "dtype": "float32"} for k in range(6)]
    live = [(k, k + 1) for k in range(6)]
    assign_storage(buffers, live)
    assert len({b["storage"] for b in buffers}) == 2
