"""One line per run: pass on every evaluation set + behaviour on heldout/test. Run: python research/summ.py runs/e*"""
import json
import sys
from pathlib import Path

for d in sys.argv[1:]:
    p = Path(d) / "results.json"
    if not p.exists():
        continue
    r = json.loads(p.read_text())
    a = r["after"]
    rec = r["recipe"]
    diff = {k: v for k, v in rec.items() if k in ("p_read", "p_test", "kl_coef", "edit_penalty", "ent_coef", "lr", "n_layer",
                                                  "d_model", "budget_cpu_s", "call_cost", "retry_on_no_change",
                                                  "n_episodes", "target_kl", "constrained")}
    print(f"{Path(d).name:6s} s{r['seed']} it {r['iterations']:4d} cpu {r['train_cpu_s']:5.0f} | "
          + " ".join(f"{k.replace('gen_', '')} {a[k]['pass_rate']:.3f}" for k in a)
          + f" | test: read {a['gen_test']['read_rate']:.2f} test {a['gen_test']['test_rate']:.2f} rev {a['gen_test']['revert_rate']:.2f} "
          f"fer {a['gen_test']['first_edit_right']:.2f} | held: test {a['gen_heldout']['test_rate']:.2f} fer {a['gen_heldout']['first_edit_right']:.2f}")
