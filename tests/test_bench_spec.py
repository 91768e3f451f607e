"""scripts/bench_spec.py's parts and merge: a full run is saved in parts (a
few categories each, one bench-lock turn apiece) and reported as one."""
from __future__ import annotations

import importlib.util
import json
import os

import pandas as pd

from colibri_lab.speculative import load_category_runs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_spec", os.path.join(_ROOT, "scripts", "bench_spec.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _part(d, cats, speed, stamp, b_rows=()):
    """A saved part: every category two prompts; lookup `speed` x plain, adaptive at plain's speed."""
    os.makedirs(d)
    rows, llama = [], []
    for cat in cats:
        for item in ("a", "b"):
            for arm, tps, drafted in (("plain", 10.0, 0), ("lookup", 10.0 * speed, 4), ("adaptive", 10.0, 2)):
                rows.append({"category": cat, "item": item, "arm": arm, "repeat": 0, "decode_tok_s": tps,
                             "draft_steps": drafted // 2, "draft_n": drafted, "draft_accepted": drafted // 2,
                             "draft_ms": 1.0, "decode_ms": 100.0, "identical": True,
                             "draft_n_pos_0": drafted // 2, "draft_accepted_pos_0": drafted // 2})
            for arm, tps in (("plain", 5.0), ("pld", 6.0)):
                llama.append({"category": cat, "item": item, "arm": arm, "tps": tps, "n_tokens": 9,
                              "same_as_plain": True, "same_as_ours_plain": arm == "plain"})
    pd.DataFrame(rows).to_csv(os.path.join(d, "requests.csv"), index=False)
    machine = {"cpu": "cpu", "cores": 2, "simd": "avx512", "threads": 2, "python": "3", "date": stamp, "dirty": False}
    meta = {"argv": ["scripts/bench_spec.py", "--categories", ",".join(cats)], "machine": machine, "commit": "c0ffee",
            "load_start": "up", "load_end": "up", "categories": cats, "model": "m", "model_file": "m.gguf",
            "draft": "d", "cross": "x", "threads": 2, "per_category": 2, "max_tokens": 8, "repeats": 1,
            "slow_prompts": 1, "ours_minutes": 1.0, "llama_minutes": 1.0, "calibration": None,
            "llama": {"version": "0.3.36"}, "llama_rows": llama,
            "step_costs": {"m": {str(k): 10.0 + k for k in b_rows}, "d": {str(k): 5.0 for k in b_rows}}}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)


def test_parts_merge_into_one_report_and_a_later_part_wins(tmp_path):
    b = _bench()
    p1, p2 = str(tmp_path / "p1"), str(tmp_path / "p2")
    _part(p1, ["code_editing", "qa"], 2.0, "t1", b.COST_ROWS)
    _part(p2, ["qa", "rag"], 3.0, "t2", b.COST_ROWS)  # qa measured again: this part's numbers count
    df, llama, metas = load_category_runs([p1, p2])
    assert sorted(set(df.category)) == ["code_editing", "qa", "rag"]
    assert len(df[df.category == "qa"]) == 6 and len([r for r in llama if r["category"] == "qa"]) == 4
    # a later part without the anchor (--no-llama) keeps the earlier part's anchor rows
    p3 = str(tmp_path / "p3")
    _part(p3, ["rag"], 4.0, "t3")
    with open(os.path.join(p3, "meta.json")) as f:
        m3 = json.load(f)
    m3["llama_rows"] = []
    with open(os.path.join(p3, "meta.json"), "w") as f:
        json.dump(m3, f)
    df3, llama3, _ = load_category_runs([p1, p2, p3])
    assert set(df3[df3.category == "rag"].decode_tok_s) == {10.0, 40.0}
    assert len([r for r in llama3 if r["category"] == "rag"]) == 4
    _, _, metas3 = load_category_runs([p1, p2, p3])
    assert metas3[1]["ours_used"] == ["qa"] and metas3[1]["anchor_used"] == ["qa", "rag"]
    assert metas3[2]["ours_used"] == ["rag"] and metas3[2]["anchor_used"] == []
    ap = type("AP", (), {"get_default": staticmethod(lambda k: "x")})
    args = type("A", (), {"quick": False, "out": str(tmp_path / "out.md")})
    out, verdicts = b.report(df, llama, metas, args, ap)
    text = "\n".join(out)
    assert "part 1 (code_editing, qa; ours used for code_editing;" in text and "part 2 (qa, rag;" in text
    assert "| 1 | m | 11.0 (1.00) | 12.0 (1.09) |" in text and "| 2 | d | 5.0 (0.45) |" in text
    qa = next(line for line in out if line.startswith("| qa | 10.0 |"))
    assert "**3.00x**" in qa
    anchor = next(line for line in out if line.startswith("| rag | 5.0 | 6.0 |"))
    assert "1.20x" in anchor and "| 2.00 " in anchor and "5.00 [5.00, 5.00] (lookup) | 2/2 |" in anchor
    assert any("code_editing: lookup 2.00x" in v and "MISSED" in v for v in verdicts)
    assert any(v.startswith("adaptive >= 0.97x on every category: **met**") for v in verdicts)
    # the report replaces the top of the doc and keeps the earlier records after its first '---' line
    with open(args.out, "w") as f:
        f.write("old top\n\n---\n\nEarlier record\n")
    b.write_report(out, verdicts, args, ap)
    doc = open(args.out).read()
    assert doc.startswith("## Speculative decoding by task category") and "old top" not in doc
    assert doc.rstrip().endswith("Earlier record")
