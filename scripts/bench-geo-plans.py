#!/usr/bin/env python3
"""The solver's plan against two baselines on the geo-distributed scenarios (issue 9), all
predicted by the same simulator (`pipert simulate --plan`):

  solver         `pipert plan --spanning`: stages, replicas, uneven split and sites chosen;
  even-spanning  the blocks split evenly, every pipeline across sites: the devices in the
                 cluster file's order, stage s of replica r on device s*R + r (so a stage's
                 replicas sit together and each pipeline crosses the site boundaries in order);
  site-local     the blocks split evenly, whole pipelines inside a site, as many as fit in each
                 site (greedy), the replicas across sites.

For each baseline every stage count S that divides the blocks is tried, with as many replicas as
the devices hold, and the fastest that fits in memory is kept. Prints a Markdown table.

Usage: scripts/bench-geo-plans.py [--build DIR] [--out DIR] [--cases "F1 F2 ..."] [-- KEY=VALUE ...]
  Cluster files default to examples/clusters/yuan2022-case{1..5}.json; the model to GPT-3 XL's
  shape (24 blocks, 2048 wide, 16 heads, vocab 50257) at sequence 1024 with recompute and 1F1B
  with flush over 16 microbatches of 1 sequence (what fits a 16 GB V100 here).
"""
import argparse
import json
import os
import re
import subprocess
import sys

MODEL = ["--model.n_layer=24", "--model.n_embd=2048", "--model.n_head=16",
         "--model.block_size=1024", "--model.vocab_size=50257", "--train.batch_size=1",
         "--pipeline.microbatches=16", "--pipeline.recompute=true", "--pipeline.schedule=1f1b"]
UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(text):
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    return float(m.group(1)) * UNITS[m.group(2).lower()]


def devices(cluster):
    """Every device as (site, group, memory bytes), in the file's order."""
    out = []
    for site in cluster["sites"]:
        for group in site.get("groups", []):
            out += [(site["name"], group["name"], byte_size(group["memory"]))] * group["count"]
    return out


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(" ".join(command) + ": " + result.stderr.strip()[-500:])
    return result.stdout


def simulate(pipert, plan_path, memory_of):
    """tokens/s of a plan, or None when a rank needs more memory than its device has."""
    out = plan_path + ".sim.json"
    run([pipert, "simulate", "--plan", plan_path, "--json", out])
    sim = json.load(open(out))
    plan = json.load(open(plan_path))
    for rank in sim["ranks"]:
        where = plan["placement"][rank["replica"]][rank["stage"]]
        if rank["memory_bytes"] > memory_of[(where["site"], where["group"])]:
            return None
    return sim["tokens_per_s"]


def write_plan(template, path, stages, replicas, placement):
    n_layer = template["config"]["model"]["n_layer"]
    layers = [n_layer // stages + (1 if s < n_layer % stages else 0) for s in range(stages)]
    plan = dict(template)
    plan.update(stages=stages, replicas=replicas, layers=",".join(map(str, layers)),
                placement=[[{"site": site, "group": group} for site, group in pipeline]
                           for pipeline in placement])
    plan.pop("predicted", None)
    json.dump(plan, open(path, "w"), indent=1)


def even_spanning(devs, stages):
    replicas = len(devs) // stages
    return replicas, [[devs[s * replicas + r][:2] for s in range(stages)] for r in range(replicas)]


def site_local(devs, stages):
    placement, by_site = [], {}
    for d in devs:
        by_site.setdefault(d[0], []).append(d[:2])
    for site_devices in by_site.values():
        for k in range(len(site_devices) // stages):
            placement.append(site_devices[k * stages:(k + 1) * stages])
    return len(placement), placement


def best_baseline(pipert, template, devs, memory_of, place, name, work):
    n_layer = template["config"]["model"]["n_layer"]
    best = (None, None, None)
    for stages in [s for s in range(1, n_layer + 1) if n_layer % s == 0]:
        replicas, placement = place(devs, stages)
        if replicas < 1:
            continue
        path = os.path.join(work, f"{name}-{stages}.plan")
        write_plan(template, path, stages, replicas, placement)
        tokens = simulate(pipert, path, memory_of)
        if tokens and (best[0] is None or tokens > best[0]):
            best = (tokens, stages, replicas)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="runs/geo-plans")
    parser.add_argument("--cases", default=" ".join(
        f"examples/clusters/yuan2022-case{i}.json" for i in range(1, 6)))
    parser.add_argument("overrides", nargs="*", help="extra --section.key=value for the model")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    pipert = os.path.join(args.build, "tools", "pipert")
    os.makedirs(args.out, exist_ok=True)
    model = MODEL + [o if o.startswith("--") else "--" + o for o in args.overrides]
    print("| scenario | devices | solver: S x R, sites | tokens/s | even-spanning: S x R | tokens/s "
          "| site-local: S x R | tokens/s | solver / even-spanning | solver / site-local |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split():
        name = os.path.splitext(os.path.basename(case))[0]
        work = os.path.join(args.out, name)
        os.makedirs(work, exist_ok=True)
        cluster = json.load(open(case))
        devs = devices(cluster)
        memory_of = {(d[0], d[1]): d[2] for d in devs}
        solver_path = os.path.join(work, "solver.plan")
        run([pipert, "plan", "--cluster", case, "--out", solver_path, "--spanning", "--keep", "1"]
            + model)
        template = json.load(open(solver_path))
        solver = simulate(pipert, solver_path, memory_of)
        sites_used = sorted({p["site"] for pipeline in template["placement"] for p in pipeline})
        spanning = best_baseline(pipert, template, devs, memory_of, even_spanning, "spanning", work)
        local = best_baseline(pipert, template, devs, memory_of, site_local, "local", work)

        def cell(best):
            return ("—", "no fit") if best[0] is None else (f"{best[1]} x {best[2]}", f"{best[0]:.0f}")

        def ratio(best):
            return "—" if best[0] is None else f"{solver / best[0]:.2f}x"

        print(f"| {name} | {len(devs)} | {template['stages']} x {template['replicas']}, "
              f"{'+'.join(sites_used)} | {solver:.0f} | {' | '.join(cell(spanning))} | "
              f"{' | '.join(cell(local))} | {ratio(spanning)} | {ratio(local)} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
