"""A mixture over 3 ranks started by torchrun (gloo on 127.0.0.1): each epoch's quotas split over the ranks,
equal batch counts with DDP training on every batch, and a merged mid-epoch checkpoint resumed exactly."""

from __future__ import annotations

from collections import Counter

from test_distributed import torchrun
from test_mixing import BASES, source_of, write_source


def test_a_mixture_checkpoint_of_two_ranks_resumes_mid_epoch_on_three(tmp_path):
    sources = {"big": write_source(tmp_path / "big", BASES["big"], 1000),
               "small": write_source(tmp_path / "small", BASES["small"], 10, files=1),
               "mid": write_source(tmp_path / "mid", BASES["mid"], 300)}
    options = {"batch_size": 16, "num_workers": 1, "shuffle": True, "shuffle_buffer_size": 32, "interleave": 2,
               "source_column": "src", "plan_cache": False}
    spec = {"sources": sources, "weights": {"big": 0.6, "small": 0.1, "mid": 0.3}, "epoch_rows": 600, "stop": 4,
            "options": options, "checkpoint": str(tmp_path / "merged.json")}
    saved = torchrun(2, {**spec, "mode": "save"}, tmp_path, script="mix_child.py")
    resumed = torchrun(3, {**spec, "mode": "resume"}, tmp_path, script="mix_child.py")
    whole = Counter((s, i) for r in saved for names, ids in r["whole"] for s, i in zip(names, ids, strict=True))
    before = Counter((s, i) for r in saved for names, ids in r["before"] for s, i in zip(names, ids, strict=True))
    rest = Counter((s, i) for r in resumed for names, ids in r["rest"] for s, i in zip(names, ids, strict=True))
    assert {len(r["rest"]) for r in resumed} == {resumed[0]["len"]}   # equal batches on every rank (DDP ran)
    assert not (before + rest) - whole   # no row more often than in the uninterrupted epoch
    assert sum((whole - (before + rest)).values()) < 6 * 16   # at most even_batches' trim of the new slots
    # epoch 2, whole on 3 ranks: the quotas split over the ranks, equal batches, each batch its shares
    quotas, slot_quotas = resumed[0]["quotas"], resumed[0]["slot_quotas"]
    assert quotas == {"big": 360, "small": 60, "mid": 180}
    assert {len(r["epoch2"]) for r in resumed} == {resumed[0]["len2"]}
    counts = Counter(s for r in resumed for names, _ in r["epoch2"] for s in names)
    assert all(counts[name] <= quota for name, quota in quotas.items())
    assert sum(quotas.values()) - sum(counts.values()) < 6 * 16
    mid = [i for r in resumed for _, ids in r["epoch2"] for i in ids if source_of(i) == "mid"]
    assert len(mid) == len(set(mid))   # mid's rows 360..540 of its passes: inside its second pass, each once
    for rank, result in enumerate(resumed):
        for index, (names, ids) in enumerate(result["epoch2"]):
            assert [source_of(i) for i in ids] == names
            share = slot_quotas[rank]   # one worker per rank
            total = sum(share.values())
            assert all(abs(names.count(n) - len(names) * q / total) < 1 + 1e-9 for n, q in share.items())
