"""Both UI-MOPD stages through verl's own trainers on CPU: ``verl-mopd smoke``, checked, in CI.

The one end-to-end run of the suite (~10 minutes on 2 cores, ~10 GB at its peak): verl's SFT
trainer twice (stage 1), then ``python -m verl_mopd.trainer.main`` on the stage-2 recipe for two
steps, a restart, and a third step from the checkpoint, on tiny Qwen3-VL models with screenshots.
Then the smoke's checks are shown to fail on runs tampered with in the ways they guard against.
"""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from verl_mopd.testing import smoke

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    result = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "smoke", "--out", str(out)],
                            capture_output=True, text=True, timeout=3600)
    return out, result


def test_both_stages_train_through_verls_trainers_and_every_check_passes(run):
    out, result = run
    assert result.returncode == 0, result.stdout[-8000:] + "\n" + result.stderr[-4000:]
    checks = json.loads((out / "checks.json").read_text())
    assert len(checks) >= 20 and all(c["result"] == "PASS" for c in checks), checks
    names = " | ".join(c["check"] for c in checks)
    for wanted in ("teacher log-probs = direct forward", "actor K3 sum", "gate fraction", "grad norm",
                   "rewards vary", "both platforms", "rollout weights = actor weights", "resume"):
        assert wanted in names
    assert "checks passed" in result.stdout and "PASS" in result.stdout  # the table is printed
    # verl's own per-step metrics log, as its file logger writes it, both stage-2 processes
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all("actor/mopd/k3_sum_kl_on" in line["data"] and "timing_s/step" in line["data"] for line in lines)
    phases = json.loads((out / "phases.json").read_text())
    assert [p["phase"] for p in phases] == ["data + models", "stage1/desktop", "stage1/mobile", "stage2",
                                            "stage2_resume", "checks"]
    assert all(p["ok"] and p["seconds"] > 0 for p in phases)
    print("\n" + "\n".join(f"{p['phase']}: {p['seconds']} s" for p in phases))


def _checks_of(root) -> dict[str, smoke.Check]:
    paths = smoke.Paths(root, smoke.default_recipes())
    return {c.name: c for c in smoke.run_checks(paths, smoke.PROFILES["cpu"])}


def _failed(checks: dict, fragment: str) -> list[str]:
    return [name for name, c in checks.items() if fragment in name and not c.passed]


def test_the_checks_fail_on_runs_tampered_with(run, tmp_path):
    out, result = run
    assert result.returncode == 0
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("ckpt", "models", "teachers"))
    for name in ("models", "teachers"):
        (copy / name).symlink_to(out / name)
    (copy / "stage2" / "ckpt").symlink_to(out / "stage2" / "ckpt")
    assert all(c.passed for c in _checks_of(copy).values())

    # a teacher log-prob off by 1e-4 nats in one stored sample
    dump = copy / "stage2" / "dumps" / "step_2.pt"
    original = dump.read_bytes()
    step = torch.load(dump, weights_only=False)
    row = next(r for r in step["rows"] if r["gate"])
    row["teacher"][0] += 1e-4
    torch.save(step, dump)
    assert _failed(_checks_of(copy), "teacher log-probs")  # (1e-4 in one token moves the K3 sum by ~1e-8)

    # one sample's stored student log-probs half a nat off (a misaligned row is off by whole nats): the
    # actor's K3 no longer matches the dump's
    row["teacher"][0] -= 1e-4
    row["student"] += 0.5
    torch.save(step, dump)
    assert _failed(_checks_of(copy), "step 2: actor K3 sum")
    dump.write_bytes(original)

    # the actor's logged K3 off by 0.2 %
    metrics = copy / "stage2" / "stage2_metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    lines[0]["data"]["actor/mopd/k3_sum_kl_on"] *= 1.002
    metrics.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert _failed(_checks_of(copy), "step 1: actor K3 sum")

    # one tensor of the rollout not updated by a sync
    sync = copy / "stage2" / "rollout_sync.jsonl"
    records = [json.loads(line) for line in sync.read_text().splitlines()]
    name = next(iter(records[-1]["held"]))
    records[-1]["held"][name] = "0" * 64
    sync.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert _failed(_checks_of(copy), "rollout weights")

    # the resumed process starting from another sampler state, or with other held prompts
    states = copy / "stage2" / "dumps" / "batching_state.jsonl"
    saved = states.read_text()
    for tamper in (lambda r: r.update(sampler={"scheduler": "another"}), lambda r: r["held_prompts"].append("0" * 64)):
        records = [json.loads(line) for line in saved.splitlines()]
        tamper(next(r for r in records if r["step"] == 3 and r["when"] == "begin"))
        states.write_text("\n".join(json.dumps(r) for r in records) + "\n")
        assert _failed(_checks_of(copy), "resume")
