"""``verl-mopd smoke``: does this install really train? Both UI-MOPD stages through verl's own trainers.

    verl-mopd smoke                      # on CPU (the harness of verl_mopd.testing.cpu), ~10 minutes
    verl-mopd smoke --device cuda        # on one GPU: Megatron-Core student and teacher, SGLang
    verl-mopd smoke --out DIR --timeout 1200

On tiny Qwen3-VL checkpoints built locally (:mod:`verl_mopd.testing.tiny`) and the bundled fixture
trajectories (screenshots included), in order, each phase timed:

1. ``data``: ``python -m verl_mopd.data.fixtures`` and ``verl-mopd prepare`` make the RL and SFT parquet.
2. ``models``: one tokenizer and processor for every model; a random teacher base; the student, a
   random model warmed up on the SFT data (a short torch loop standing in for a pretrained student:
   a random model never writes a parseable tool call, so every reward would be -1 and GRPO's
   advantages zero).
3. ``stage1/<platform>``: ``python -m verl.trainer.sft_trainer_ray`` on
   ``recipes/ui_mopd/stage1_teacher_sft_<platform>.yaml +smoke=stage1_<device>``: 2 steps from the
   teacher base and a checkpoint, which verl's model merger turns into the teacher's HF folder.
4. ``stage2``: ``python -m verl_mopd.trainer.main`` on ``recipes/ui_mopd/stage2_mopd_qwen3vl8b.yaml
   +smoke=stage2_<device>`` (the recipe's own reward, quota sampler and reward gate): steps 1-2 with a
   checkpoint at step 2; the process ends; ``stage2_resume`` starts it again and runs step 3 from
   that checkpoint.
5. ``checks``: :func:`run_checks` on what the runs left (verl's metrics log, the trainers' step dumps
   ``VERL_MOPD_STEP_DUMP``, the rollout's weight-sync log ``VERL_MOPD_ROLLOUT_SYNC_LOG``).

``--out DIR`` (default: a new temporary folder) keeps everything: ``metrics.jsonl`` (verl's file
logger lines of stage 2, both processes), ``checks.json`` (the table), ``phases.json`` (seconds per
phase), ``logs/`` (each process's output), the models, checkpoints and dumps. Exit code 0 when every
check passes, 1 when one fails or a phase fails (its log's tail is printed), 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from verl_mopd.errors import UsageError
from verl_mopd.gpu_stack import NO_DEPS

if TYPE_CHECKING:
    import torch

PLATFORMS = ("desktop", "mobile")
STAGE1_STEPS, STAGE2_STEPS, RESUME_STEP = 2, 3, 2
#: stage 2's trainer processes: steps 1-2 (a checkpoint at 2), then a restart that resumes for step 3
#: (``--no-resume``: the last one alone, steps 1-3 in one process)
STAGE2_LAUNCHES = (("stage2", RESUME_STEP), ("stage2_resume", STAGE2_STEPS))
REPO_RECIPES = "recipes/ui_mopd"


@dataclass(frozen=True)
class Profile:
    """What differs between the smoke's runs: the recipes' smoke profiles, engines and tolerances."""

    device: str                         # cpu | cuda
    stage1: str                         # recipes/ui_mopd/smoke/<stage1>.yaml
    stage2: str                         # recipes/ui_mopd/smoke/<stage2>.yaml
    stage1_engine: str                  # verl's engine of the SFT trainer (megatron | fsdp)
    actor_engine: str                   # verl's engine of the stage-2 actor (megatron | fsdp)
    actor_tp: int                       # the actor's tensor-parallel size (what the profile sets; a test checks it)
    teacher_backends: dict[str, str]    # what the stage-2 profile sets (a test checks it)
    teacher_tolerance: dict[str, float]  # per teacher backend: max |stored - direct forward| (nats)
    student_tolerance: float            # max |actor's old log-probs - direct forward of the student| (nats)
    k3_tolerance: float                 # relative: the actor's K3 sum against the float64 one of the dumps
                                        #   (fp32 on CPU: within 6e-8 in every run measured)
    environment: Callable[[], dict[str, str]]
    sync_tolerance: float = 0.05        # max |p_rollout - p_actor| of a sampled token (the rollout computes in
                                        #   bfloat16: 0.023 at most in the CPU runs measured)

    @property
    def engines(self) -> dict:
        """``checks.json``'s record of which engine ran each phase."""
        return {"stage1": self.stage1_engine, "actor": self.actor_engine, "teachers": dict(self.teacher_backends)}


def _cpu_environment(megatron: bool) -> Callable[[], dict[str, str]]:
    def environment() -> dict[str, str]:
        from verl_mopd.testing.cpu import environment

        return environment(megatron=megatron, gpus=2 if megatron else 1)

    return environment


PROFILES = {
    # the recipes' own layouts: verl's Megatron engine (stage 1 SFT at TP 2; the student at TP 2, both
    # teachers megatron, colocated, forward only), fp32; the hf rollout stands in for SGLang
    "cpu": Profile("cpu", "stage1_cpu", "stage2_cpu", "megatron", "megatron", 2, {"desktop": "megatron", "mobile": "megatron"},
                   {"megatron": 1e-5}, 1e-5, 1e-6, _cpu_environment(megatron=True)),
    # verl's FSDP engine, which users run too: FSDP2 in fp32, hf teachers
    "cpu-fsdp": Profile("cpu", "stage1_cpu_fsdp", "stage2_cpu_fsdp", "fsdp", "fsdp", 1, {"desktop": "hf", "mobile": "hf"},
                        {"hf": 1e-5}, 1e-5, 1e-6, _cpu_environment(megatron=False)),
    # hf on a GPU: cuDNN's TF32 convolutions in the vision tower; megatron: bfloat16 kernels against fp32;
    # the actor's bfloat16 log-probs in the update against its own old_log_probs of the dump: 1e-2
    "cuda": Profile("cuda", "stage1_gpu", "stage2_gpu", "megatron", "megatron", 1, {"desktop": "hf", "mobile": "megatron"},
                    {"hf": 1e-4, "megatron": 0.1}, 0.1, 1e-2, dict, sync_tolerance=0.1),
}
ENGINES = ("megatron", "fsdp")


def profile_name(device: str, engine: str) -> str:
    """The :data:`PROFILES` key of ``--device`` and ``--engine``."""
    name = device if engine == "megatron" else f"{device}-{engine}"
    if name not in PROFILES:
        raise UsageError(f"--engine {engine!r} with --device {device!r}: the smoke has "
                         f"{sorted(PROFILES)} (--engine fsdp runs on the CPU only)")
    return name


@dataclass
class SmokeConfig:
    device: str = "cpu"
    engine: str = "megatron"
    out: str | None = None
    timeout: float = 900.0       # seconds, per trainer process
    warmup_steps: int = 150     # batches of 8: ~23 passes over the 53 SFT samples (loss 6.9 -> 0.07)
    warmup_lr: float = 4e-3
    fixture_trajectories: int = 8  # per platform
    seed: int = 0
    recipes: str | None = None   # default: the package's repository recipes folder
    resume: bool = True          # stage 2 stops after step 2 and a second process resumes it for step 3

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"--device {self.device!r}: allowed values are ['cpu', 'cuda']")
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: allowed values are {list(ENGINES)}")
        profile_name(self.device, self.engine)
        if not (isinstance(self.timeout, int | float) and math.isfinite(self.timeout) and self.timeout > 0):
            raise UsageError(f"--timeout {self.timeout!r}: must be a positive number of seconds")
        if self.warmup_steps < 0:
            raise UsageError(f"--warmup-steps {self.warmup_steps}: must be >= 0")


@dataclass
class Paths:
    root: Path
    recipes: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def prepared(self) -> Path:
        return self.data / "prepared"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def stage2(self) -> Path:
        return self.root / "stage2"

    def stage1(self, platform: str) -> Path:
        return self.root / "stage1" / platform

    def teacher(self, platform: str) -> Path:
        return self.root / "teachers" / platform


def default_recipes() -> Path:
    """``recipes/ui_mopd`` of the checkout verl-mopd is installed from (editable install)."""
    import verl_mopd

    return Path(verl_mopd.__file__).resolve().parents[1] / REPO_RECIPES


# ------------------------------------------------------------------------------------ phases
#: how often a running phase prints a line (seconds): no phase is silent for longer
PROGRESS_EVERY = 20.0
#: log line fragment of a verl run -> what the run does from there on (the last one met is shown)
MILESTONES = (
    ("Started a local Ray instance", "Ray workers starting"),
    ("train and validate dataloader initialized", "building the actor"),
    ("actor and ref model engine initialized", "starting the rollout"),
    ("all initialize finished", "step 1: teachers and rollout starting"),
    ("Saving checkpoint", "saving a checkpoint"),
    ("Loaded rng from", "checkpoint loaded"),
)


def cache_folder() -> Path:
    """``$VERL_MOPD_CACHE`` (default ``~/.cache/verl-mopd``): the warmed student, the last run's phase times."""
    return Path(os.environ.get("VERL_MOPD_CACHE", Path.home() / ".cache" / "verl-mopd"))


@dataclass
class PhaseLog:
    """Each phase's seconds, in ``path`` as it goes; the phase headers say what the last passed run here took."""

    path: Path
    profile: str = ""
    records: list[dict] = field(default_factory=list)

    @property
    def _last_run(self) -> Path:
        return cache_folder() / "smoke-phases" / f"{self.profile}.json"

    def expected(self, name: str) -> float | None:
        """The seconds phase ``name`` took in the last passed run of this profile here, if any."""
        try:
            return {r["phase"]: r["seconds"] for r in json.loads(self._last_run.read_text())}.get(name)
        except (OSError, ValueError):
            return None

    def passed(self) -> None:
        """Keep this run's phase times for the next run's estimates."""
        self._last_run.parent.mkdir(parents=True, exist_ok=True)
        self._last_run.write_text(json.dumps(self.records, indent=1))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        expected = self.expected(name)
        known = "" if expected is None else f" (last run here: {expected:.0f} s)"
        print(f"[smoke] {name} ...{known}", flush=True)
        ok = False
        try:
            yield
            ok = True
        finally:
            seconds = time.monotonic() - started
            self.records.append({"phase": name, "seconds": round(seconds, 1), "ok": ok})
            self.path.write_text(json.dumps(self.records, indent=1))
            print(f"[smoke] {name}: {'done' if ok else 'FAILED'} in {seconds:.1f} s", flush=True)


class PhaseFailed(RuntimeError):
    """A phase's process failed; the message holds the tail of its log."""


def progress_line(label: str, elapsed: float, log: Path, metrics: Path | None = None, steps: int = 0,
                  expected: float | None = None) -> str:
    """What a running verl process is doing, from its log and its metrics file: the last milestone met, the
    steps done, and (from the last passed run here) about how long it has left."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 400_000))
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    met = [(text.rfind(fragment), doing) for fragment, doing in MILESTONES if fragment in text]
    doing = max(met)[1] if met else "starting"
    if metrics is not None and metrics.is_file():
        try:
            done = json.loads(metrics.read_text(encoding="utf-8").splitlines()[-1])["step"]
        except (IndexError, ValueError, KeyError):  # nothing written yet, or a line being written
            done = None
        if done:
            doing = f"{doing}; step {done}/{steps} done" if doing.startswith("saving") else f"step {done}/{steps} done"
    left = "" if expected is None else (f", ~{expected - elapsed:.0f} s left" if elapsed < expected
                                        else f", longer than the last run here ({expected:.0f} s)")
    return f"{label}: {elapsed:.0f} s, {doing}{left}"


def run_process(argv: list[str], env: dict[str, str], log: Path, timeout: float, cwd: Path,
                progress: Callable[[float], str] | None = None) -> None:
    """Run ``argv`` in its own process group, output to ``log``; kill the whole group on time-out.

    ``progress(elapsed)``, if given, is printed every :data:`PROGRESS_EVERY` seconds while it runs.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                   start_new_session=True)
        started = shown = time.monotonic()
        code: int | None = None
        try:
            while True:
                try:
                    code = process.wait(timeout=min(1.0, PROGRESS_EVERY))
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if now - started > timeout:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait()
                        code = None
                        break
                    if progress is not None and now - shown >= PROGRESS_EVERY:
                        print(f"[smoke]   {progress(now - started)}", flush=True)
                        shown = now
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        why = f"timed out after {timeout:.0f} s (--timeout)" if code is None else f"exited with {code}"
        raise PhaseFailed(f"{' '.join(argv[:3])} ... {why}; last lines of {log}:\n" + "\n".join(tail))


# ------------------------------------------------------------------------------------ the run
def build_inputs(cfg: SmokeConfig, paths: Paths) -> dict[str, Path]:
    """Fixture, prepared parquet, tokenizer/processor, teacher base and warmed-up student."""
    from verl_mopd import cli
    from verl_mopd.data.fixtures import make_fixture
    from verl_mopd.testing import tiny

    jsonl = make_fixture(str(paths.data / "uni_gui"), per_platform=cfg.fixture_trajectories, seed=cfg.seed)
    code = cli.main(["prepare", "--input", jsonl, "--out", str(paths.prepared)])
    if code != 0:
        raise PhaseFailed(f"verl-mopd prepare exited with {code}")
    rl = paths.prepared / "rl"
    sft = {p: paths.prepared / "sft" / p for p in PLATFORMS}
    parquet = [rl / "train.parquet", rl / "val.parquet"] + [sft[p] / s for p in PLATFORMS
                                                          for s in ("train.parquet", "val.parquet")]
    texts = tiny.corpus(parquet)
    tokenizer = tiny.build_tokenizer(texts)
    processor = tiny.build_processor(tokenizer)
    base = tiny.save_model(paths.models / "teacher_base", tokenizer, processor, "teacher", seed=cfg.seed + 1)
    tiny.check_tokenizer(base, texts)
    student = tiny.save_model(paths.models / "student", tokenizer, processor, "student", seed=cfg.seed)
    warm_up_student(cfg, student, [sft[p] / "train.parquet" for p in PLATFORMS])
    return {"rl": rl, "base": base, "student": student, **{f"sft_{p}": sft[p] for p in PLATFORMS}}


def warm_up_student(cfg: SmokeConfig, student: Path, sft_files: list[Path]) -> None:
    """:func:`verl_mopd.testing.tiny.warm_up`, or its weights from an earlier run with the same inputs.

    The warmed weights are kept in ``$VERL_MOPD_CACHE`` (default ``~/.cache/verl-mopd``) under the sha256 of
    everything the warm-up reads: the random student's files, the SFT parquet, the steps, lr and seed,
    and the warm-up's own source. A second smoke on this machine (the other engine, say) skips it.
    """
    import hashlib
    import inspect
    import shutil

    from verl_mopd.testing import tiny

    digest = hashlib.sha256(inspect.getsource(tiny.warm_up).encode() + inspect.getsource(tiny._right_padded).encode())
    for path in sorted(student.iterdir()) + sorted(sft_files):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{cfg.warmup_steps} {cfg.warmup_lr} {cfg.seed}".encode())
    cached = cache_folder() / "smoke-student" / digest.hexdigest()[:32] / "model.safetensors"
    if cached.is_file():
        shutil.copyfile(cached, student / "model.safetensors")
        print(f"[smoke] student warm-up: {cfg.warmup_steps} steps, taken from {cached.parent} (same inputs)")
        return
    started, shown = time.monotonic(), [time.monotonic()]

    def on_step(step: int, loss: float) -> None:
        now = time.monotonic()
        if now - shown[0] >= PROGRESS_EVERY:
            left = (now - started) / step * (cfg.warmup_steps - step)
            print(f"[smoke]   student warm-up: step {step}/{cfg.warmup_steps}, loss {loss:.2f}, ~{left:.0f} s left",
                  flush=True)
            shown[0] = now

    print(f"[smoke] student warm-up: {cfg.warmup_steps} steps (cached by its inputs for the next run)", flush=True)
    losses = tiny.warm_up(student, tiny.sft_examples(sft_files), steps=cfg.warmup_steps, lr=cfg.warmup_lr,
                          seed=cfg.seed, on_step=on_step)
    if losses:
        tail = losses[-20:]
        print(f"[smoke] student warm-up: {len(losses)} steps, loss {losses[0]:.2f} -> {sum(tail) / len(tail):.2f}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial")
    shutil.copyfile(student / "model.safetensors", partial)
    partial.replace(cached)


def teacher_folder(engine: str, step_folder: Path, target: Path) -> None:
    """The stage-1 teacher's Hugging Face folder at ``target``, from verl's checkpoint ``step_folder``.

    Megatron: the folder verl writes through the bridge with every checkpoint
    (``global_step_N/model/huggingface``), linked, never converted (verl's Megatron merger cannot read
    Qwen3-VL). FSDP: verl's FSDP model merger (``python -m verl.model_merger merge``), in this process.
    """
    if engine == "megatron":
        folder = step_folder / "model" / "huggingface"
        if not (folder / "config.json").is_file():
            raise PhaseFailed(f"{folder}: verl wrote no Hugging Face folder with the stage-1 checkpoint")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.path.relpath(folder, target.parent), target_is_directory=True)
        return
    from verl.model_merger.base_model_merger import generate_config_from_args, parse_args
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    argv = ["merge", "--backend", "fsdp", "--local_dir", str(step_folder), "--target_dir", str(target)]
    saved, sys.argv = sys.argv, ["verl.model_merger", *argv]
    try:
        config = generate_config_from_args(parse_args())
    finally:
        sys.argv = saved
    FSDPModelMerger(config).merge_and_save()


def preflight(device: str, profile: Profile) -> None:
    """What the profile needs that a bad install lacks, as one clear error before anything runs."""
    import importlib
    import importlib.util

    missing = []
    for module, why in (("torchvision", "Qwen3-VL's video processor and qwen_vl_utils, which verl's datasets read "
                                        "images with"), ("qwen_vl_utils", "verl's datasets read images with it")):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - ImportError, or torchvision's ops failing to load
            missing.append(f"{module} ({why}): {type(exc).__name__}: {exc}")
    if missing:
        raise UsageError("the smoke's Qwen3-VL models need " + "; ".join(missing) +
                         ". Install the tour's extra (Python 3.12): pip install -e '.[tour]' && pip install --no-deps "
                         "megatron-bridge==" + NO_DEPS["megatron-bridge"] + " (torch and torchvision as a matching pair)")
    if device == "cpu" and profile.actor_engine == "megatron":
        absent = [name for module, name in (("megatron.core", "megatron-core"), ("megatron.bridge", "megatron-bridge"),
                                            ("modelopt", "nvidia-modelopt"))
                  if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None]
        if absent:
            raise UsageError(f"the smoke runs verl's Megatron engine on CPU and needs {', '.join(absent)} (Python 3.12): "
                             "pip install -e '.[tour]' && pip install --no-deps megatron-bridge==" +
                             NO_DEPS["megatron-bridge"] + "; or run verl's FSDP engine: verl-mopd smoke --engine fsdp")
    if device == "cuda":
        import torch

        from verl_mopd.teachers.backends.megatron import check_megatron_stack

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA device here")
        if not check_megatron_stack():
            raise UsageError("--device cuda: verl's Megatron engine cannot be built here (see above); install the GPU "
                             "stack of the README")


def run_smoke(cfg: SmokeConfig) -> int:
    """The whole smoke; returns the exit code (0: every check passed)."""
    profile = PROFILES[profile_name(cfg.device, cfg.engine)]
    preflight(cfg.device, profile)
    root = Path(cfg.out or tempfile.mkdtemp(prefix="verl_mopd_smoke_")).resolve()
    recipes = Path(cfg.recipes).resolve() if cfg.recipes else default_recipes()
    if not (recipes / "stage2_mopd_qwen3vl8b.yaml").is_file():
        raise UsageError(f"--recipes {recipes}: no stage2_mopd_qwen3vl8b.yaml there (give the recipes/ui_mopd folder)")
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"--out {root}: not empty; give a new or empty folder")
    paths = Paths(root, recipes)
    for folder in (paths.logs, paths.stage2):
        folder.mkdir(parents=True, exist_ok=True)
    name = profile_name(cfg.device, cfg.engine)
    log = PhaseLog(root / "phases.json", name)
    print(f"[smoke] {name} profile (stage 1: {profile.stage1_engine}; actor: {profile.actor_engine}, TP "
          f"{profile.actor_tp}; teachers: {profile.teacher_backends}), output in {root}")
    env = profile.environment()
    try:
        with log.phase("data + models"):
            inputs = build_inputs(cfg, paths)
        for platform in PLATFORMS:
            with log.phase(f"stage1/{platform}"):
                run_stage1(paths, profile, env, inputs, platform, cfg.timeout, log.expected(f"stage1/{platform}"))
        launches = STAGE2_LAUNCHES if cfg.resume else STAGE2_LAUNCHES[-1:]
        for name, steps in launches:
            name = name if cfg.resume else "stage2"
            with log.phase(name):
                run_stage2(paths, profile, env, inputs, name, steps, cfg.timeout, log.expected(name))
        with (root / "metrics.jsonl").open("w", encoding="utf-8") as merged:
            for name in ("stage2", "stage2_resume")[: len(launches)]:
                merged.write((paths.stage2 / f"{name}_metrics.jsonl").read_text(encoding="utf-8"))
        if checks_tensor_parallel(profile):
            with log.phase(f"actor TP {profile.actor_tp} = TP 1"):
                run_tp_check(paths, profile, env, inputs["student"], cfg.timeout)
        with log.phase("checks"):
            checks = run_checks(paths, profile, resumed=cfg.resume)
    except PhaseFailed as exc:
        print(f"[smoke] FAILED: {exc}", file=sys.stderr)
        return 1
    (root / "checks.json").write_text(json.dumps({"engines": profile.engines, "actor_tp": profile.actor_tp,
                                                  "checks": [c.as_dict() for c in checks]}, indent=1))
    print(format_table(checks))
    failed = [c for c in checks if not c.passed]
    total = sum(r["seconds"] for r in log.records)
    phases = ", ".join(f"{r['phase']} {r['seconds']:.0f} s" for r in log.records)
    print(f"[smoke] {len(checks) - len(failed)}/{len(checks)} checks passed in {total:.0f} s ({phases}); output in {root}")
    if not failed:
        log.passed()
    return 1 if failed else 0


def run_stage1(paths: Paths, profile: Profile, env: dict, inputs: dict, platform: str, timeout: float,
               expected: float | None = None) -> None:
    """verl's SFT trainer on the platform's stage-1 recipe + smoke profile, then its checkpoint merged to HF."""
    folder = paths.stage1(platform)
    folder.mkdir(parents=True, exist_ok=True)
    sft = inputs[f"sft_{platform}"]
    stage1_env = {**env, "TEACHER_BASE": str(inputs["base"]), "CKPT_DIR": str(folder / "ckpt"),
                  "SFT_TRAIN_FILES": str(sft / "train.parquet"), "SFT_VAL_FILES": str(sft / "val.parquet"),
                  "VERL_FILE_LOGGER_PATH": str(folder / "metrics.jsonl")}
    log = paths.logs / f"stage1_{platform}.log"
    run_process([sys.executable, "-m", "verl.trainer.sft_trainer_ray", f"--config-path={paths.recipes}",
                 f"--config-name=stage1_teacher_sft_{platform}", f"+smoke={profile.stage1}"],
                stage1_env, log, timeout, cwd=folder,
                progress=lambda elapsed: progress_line(f"stage1/{platform}", elapsed, log, folder / "metrics.jsonl",
                                                       STAGE1_STEPS, expected))
    teacher_folder(profile.stage1_engine, stage1_step_folder(folder, STAGE1_STEPS), paths.teacher(platform))


def run_stage2(paths: Paths, profile: Profile, env: dict, inputs: dict, name: str, steps: int,
               timeout: float, expected: float | None = None) -> None:
    """``python -m verl_mopd.trainer.main`` on the stage-2 recipe + smoke profile up to ``steps``
    (resuming from the latest checkpoint in the run's folder, as verl's ``resume_mode: auto`` does)."""
    stage2_env = {**env, "TRAIN_FILES": str(inputs["rl"] / "train.parquet"),
                  "VAL_FILES": str(inputs["rl"] / "val.parquet"), "STUDENT_PATH": str(inputs["student"]),
                  **{f"{p.upper()}_TEACHER": str(paths.teacher(p)) for p in PLATFORMS},
                  "CKPT_DIR": str(paths.stage2 / "ckpt"),
                  "VERL_MOPD_STEP_DUMP": str(paths.stage2 / "dumps"),
                  "VERL_MOPD_ROLLOUT_SYNC_LOG": str(paths.stage2 / "rollout_sync.jsonl"),
                  "VERL_FILE_LOGGER_PATH": str(paths.stage2 / f"{name}_metrics.jsonl")}
    log, metrics = paths.logs / f"{name}.log", paths.stage2 / f"{name}_metrics.jsonl"
    run_process([sys.executable, "-m", "verl_mopd.trainer.main", f"--config-path={paths.recipes}",
                 "--config-name=stage2_mopd_qwen3vl8b", f"+smoke={profile.stage2}",
                 f"trainer.total_training_steps={steps}"],
                stage2_env, log, timeout, cwd=paths.stage2,
                progress=lambda elapsed: progress_line(name, elapsed, log, metrics, steps, expected))


def checks_tensor_parallel(profile: Profile) -> bool:
    """Whether the smoke compares a training step of the actor at its TP size with TP 1 (Megatron, CPU)."""
    return profile.device == "cpu" and profile.actor_engine == "megatron" and profile.actor_tp > 1


def run_tp_check(paths: Paths, profile: Profile, env: dict, student: Path, timeout: float) -> None:
    """:mod:`verl_mopd.testing.megatron_check` on the student at TP 1 and at the actor's TP (sequence
    parallel on, verl's default): one training step of verl's Megatron engine each, in fp32."""
    import socket

    folder = paths.root / "tp_check"
    folder.mkdir(exist_ok=True)
    for tp in (1, profile.actor_tp):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = paths.logs / f"tp_check_tp{tp}.log"
        run_process([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(tp), "--master_port",
                     str(port), "-m", "verl_mopd.testing.megatron_check", "--model", str(student), "--tp", str(tp),
                     "--train", "--out", str(folder / f"tp{tp}.json")],
                    env, log, timeout, cwd=folder,
                    progress=lambda elapsed, tp=tp, log=log: progress_line(f"TP {tp} train step", elapsed, log))


def stage1_step_folder(folder: Path, step: int) -> Path:
    """The ``global_step_<step>`` folder verl's SFT trainer wrote under ``folder/ckpt`` (and marked latest)."""
    hits = sorted((folder / "ckpt").glob(f"*/*/global_step_{step}"))
    if len(hits) != 1:
        raise PhaseFailed(f"expected one stage-1 checkpoint global_step_{step} under {folder / 'ckpt'}, found {hits}")
    latest = hits[0].parent / "latest_checkpointed_iteration.txt"
    if not latest.is_file() or latest.read_text().strip() != str(step):
        raise PhaseFailed(f"{latest}: verl did not mark step {step} as the latest checkpoint")
    return hits[0]


# ------------------------------------------------------------------------------------ checks
@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def as_dict(self) -> dict:
        return {"check": self.name, "result": "PASS" if self.passed else "FAIL", "detail": self.detail}


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  result  detail", "-" * (width + 40)]
    lines += [f"{c.name:<{width}}  {'PASS' if c.passed else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(lines)


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file-logger JSON lines as ``{step: metrics}``."""
    steps: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def k3_reference(d, linear_above: float, clamp_below: float):
    """The documented K3 in float64: ``exp(d) - d - 1``, linear above ``linear_above`` (tangent),
    constant below ``clamp_below`` (``verl_mopd.losses.k3_kl``'s definition, written independently)."""
    import torch

    d = d.double().clamp_min(clamp_below)
    exact = torch.exp(d) - d - 1.0
    tangent = math.exp(linear_above) - linear_above - 1.0 + math.expm1(linear_above) * (d - linear_above)
    return torch.where(d > linear_above, tangent, exact)


def run_checks(paths: Paths, profile: Profile, resumed: bool = True, only: str | None = None) -> list[Check]:
    """Every assertion of the smoke, as a list of checks (none raises: a failure is a FAIL row).

    ``resumed``: stage 2 ran as two processes, the second resuming from the first's checkpoint (else one).
    ``only``: run just the checks whose name contains it (the tamper tests re-check one thing at a time).
    """
    import torch

    checks: list[Check] = []

    def check(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
        if only is not None and only not in name:
            return
        try:
            passed, detail = fn()
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        checks.append(Check(name, bool(passed), detail))

    for platform in PLATFORMS:
        check(f"stage 1 {platform}: {STAGE1_STEPS} SFT steps, checkpoint, weights moved",
              lambda p=platform: _check_stage1(paths, p))

    first = read_metrics(paths.stage2 / "stage2_metrics.jsonl")
    second = read_metrics(paths.stage2 / "stage2_resume_metrics.jsonl") if resumed else {}
    metrics = {**first, **second}
    dumps = {int(p.stem.split("_")[1]): torch.load(p, weights_only=False)["rows"]
             for p in sorted((paths.stage2 / "dumps").glob("step_*.pt"))}
    if resumed:
        check("stage 2: steps 1-2, then 3 after the restart", lambda: (
            sorted(first) == [1, 2] and sorted(second) == [3] and sorted(dumps) == [1, 2, 3],
            f"first process logged steps {sorted(first)}, the resumed one {sorted(second)}; dumps of {sorted(dumps)}"))
    else:
        check("stage 2: steps 1-3 in one process (--no-resume)", lambda: (
            sorted(first) == [1, 2, 3] and sorted(dumps) == [1, 2, 3],
            f"the process logged steps {sorted(first)}; dumps of {sorted(dumps)}"))
    config = run_config(paths)
    mopd = config["mopd"]
    check("teacher log-probs = direct forward", lambda: _check_teachers(paths, profile, dumps))
    check("student log-probs at step 1 = direct forward", lambda: _check_student(paths, profile, dumps))
    if checks_tensor_parallel(profile):
        check(f"actor: one train step at TP {profile.actor_tp} = TP 1", lambda: _check_tp(paths, profile))
    for step in sorted(metrics):
        m, rows = metrics[step], [r for r in dumps.get(step, []) if not r["padding"]]
        check(f"step {step}: actor K3 sum = float64 K3 of the dumped log-probs",
              lambda m=m, rows=rows: _check_k3(m, rows, profile.k3_tolerance))
        check(f"step {step}: distillation loss = K3 sum / response tokens; loss = pg_loss + beta x it",
              lambda m=m, rows=rows: _check_loss_terms(m, rows, config, profile.k3_tolerance))
        check(f"step {step}: actor gate fraction = driver's", lambda m=m, rows=rows: _check_gate(m, rows))
        check(f"step {step}: gate = recomputed from the scores (group mean {mopd['gate_metric']} <= tau_kl)",
              lambda rows=rows: _check_gate_value(rows, mopd))
        check(f"step {step}: grad norm > 0", lambda m=m: _check_grad_norm(m))
        check(f"step {step}: rewards vary within a group (PG term non-zero)", lambda rows=rows: _check_pg(rows))
        check(f"step {step}: both platforms' metrics = recomputed from the dump",
              lambda m=m, rows=rows: _check_platform_metrics(m, rows))
    check("rollout weights = the actor's own weights after every sync", lambda: _check_syncs(paths, metrics))
    for step in sorted(metrics):
        check(f"step {step}: rollout's probabilities of its tokens = the actor's (max diff <= "
              f"{profile.sync_tolerance:g})", lambda step=step: _check_rollout_probs(
                  dumps.get(step, []), profile.sync_tolerance))
    check("the student moved more than that tolerance at every step after the first", lambda: _check_student_moved(
        paths, profile, dumps))
    if resumed:
        check(f"resume: step {RESUME_STEP + 1} starts from the saved sampler state and held prompts",
              lambda: _check_resume(paths))
    return checks


def _check_stage1(paths: Paths, platform: str) -> tuple[bool, str]:
    from safetensors.torch import load_file

    steps = read_metrics(paths.stage1(platform) / "metrics.jsonl")
    losses = [steps[s]["train/loss"] for s in sorted(steps) if "train/loss" in steps[s]]
    base = load_file(str(paths.models / "teacher_base" / "model.safetensors"))
    teacher = load_file(str(paths.teacher(platform) / "model.safetensors"))
    moved = max((teacher[k].double() - base[k].double()).abs().max().item() for k in base if k in teacher)
    same_names = set(base) == set(teacher)
    ok = len(losses) == STAGE1_STEPS and all(math.isfinite(x) for x in losses) and moved > 0 and same_names
    return ok, (f"losses {[round(x, 3) for x in losses]}, merged checkpoint has the base's {len(base)} tensors: "
                f"{same_names}, max |w - w_base| {moved:.2e}")


def _check_teachers(paths: Paths, profile: Profile, dumps: dict[int, list]) -> tuple[bool, str]:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    device = "cuda" if torch.cuda.is_available() and profile.device == "cuda" else "cpu"
    backends = profile.teacher_backends
    worst: dict[str, float] = {}
    counts: dict[str, int] = {}
    for platform in PLATFORMS:
        path = paths.teacher(platform)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).to(device).eval()
        image_token = AutoConfig.from_pretrained(path).image_token_id
        for rows in dumps.values():
            for row in rows:
                if row["padding"] or row["platform"] != platform or not row["gate"]:
                    continue
                want = direct_response_logprobs(model, row["input_ids"], len(row["teacher"]),
                                                row["multi_modal_inputs"], image_token, device)
                err = (row["teacher"].double() - want).abs().max().item()
                worst[platform] = max(worst.get(platform, 0.0), err)
                counts[platform] = counts.get(platform, 0) + 1
    tolerance = {p: profile.teacher_tolerance[backends[p]] for p in PLATFORMS}
    ok = all(counts.get(p, 0) > 0 and worst[p] <= tolerance[p] for p in PLATFORMS)
    return ok, "; ".join(f"{p} ({backends[p]}): {counts.get(p, 0)} samples, max err {worst.get(p, float('nan')):.2e} "
                         f"<= {tolerance[p]:g}" for p in PLATFORMS)


def _starting_student(paths: Paths, profile: Profile, rows: list[dict]) -> list[tuple[dict, torch.Tensor]]:
    """Each non-padding row with transformers' fp32 log-probs of its response under the student checkpoint the
    run started from (:func:`direct_response_logprobs`)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    device = "cuda" if torch.cuda.is_available() and profile.device == "cuda" else "cpu"
    path = paths.models / "student"
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).to(device).eval()
    image_token = AutoConfig.from_pretrained(path).image_token_id
    return [(row, direct_response_logprobs(model, row["input_ids"], len(row["student"]), row["multi_modal_inputs"],
                                           image_token, device).cpu())
            for row in rows if not row["padding"]]


def _check_student(paths: Paths, profile: Profile, dumps: dict[int, list]) -> tuple[bool, str]:
    """The actor's log-probs of step 1 (``old_log_probs``, before any update) against transformers' fp32
    forward of the student checkpoint the run started from."""
    worst, count = 0.0, 0
    for row, want in _starting_student(paths, profile, dumps.get(1, [])):
        n = int(row["response_mask"].sum())
        worst = max(worst, (row["student"][:n].double() - want[:n]).abs().max().item())
        count += 1
    ok = count > 0 and worst <= profile.student_tolerance
    return ok, (f"{profile.actor_engine} actor, {count} samples of step 1: max |old_log_probs - transformers fp32| "
                f"{worst:.2e} <= {profile.student_tolerance:g}")


def _token_probs(log_probs, mask):
    """``exp`` of the log-probs of the response tokens ``mask`` keeps, in float64."""
    return log_probs[: len(mask)][mask.bool()].double().exp()


def _check_rollout_probs(rows: list[dict], tolerance: float) -> tuple[bool, str]:
    """The rollout engine's probability of each token it sampled (``rollout_log_probs``) against the actor's
    (``old_log_probs``, computed right after the step's weight sync): max |p_rollout - p_actor| <= tolerance.
    A rollout still on older weights is off by what the student moved since (:func:`_check_student_moved`)."""
    worst, tokens = 0.0, 0
    for row in rows:
        if row["padding"]:
            continue
        if row.get("rollout") is None:
            return False, "no rollout_log_probs in the dump (actor_rollout_ref.rollout.calculate_log_probs is off?)"
        mask = row["response_mask"]
        diff = (_token_probs(row["rollout"], mask) - _token_probs(row["student"], mask)).abs()
        tokens += len(diff)
        worst = max(worst, float(diff.max())) if len(diff) else worst
    return tokens > 0 and worst <= tolerance, f"{tokens} tokens: max |p_rollout - p_actor| {worst:.3g} <= {tolerance:g}"


def _check_student_moved(paths: Paths, profile: Profile, dumps: dict[int, list]) -> tuple[bool, str]:
    """At every step after the first, the actor's probabilities of its sampled tokens differ from the starting
    student's (a direct forward) by more than the rollout check's tolerance somewhere: training moved the
    weights far enough that :func:`_check_rollout_probs` fails on a rollout left on the starting weights."""
    later = sorted(dumps)[1:]
    moved = dict.fromkeys(later, 0.0)
    rows = [{**row, "step": step} for step in later for row in dumps[step]]
    for row, want in _starting_student(paths, profile, rows):
        mask = row["response_mask"]
        diff = (_token_probs(row["student"], mask) - _token_probs(want, mask)).abs()
        moved[row["step"]] = max(moved[row["step"]], float(diff.max())) if len(diff) else moved[row["step"]]
    ok = bool(later) and all(m > profile.sync_tolerance for m in moved.values())
    return ok, ("max |p_actor - p_starting student| " + ", ".join(f"step {s} {m:.3g}" for s, m in moved.items())
                + f" > {profile.sync_tolerance:g} (the rollout check's tolerance)")


def _check_tp(paths: Paths, profile: Profile) -> tuple[bool, str]:
    """One training step of the student at the actor's TP (sequence parallel) = at TP 1: loss and grad norm
    (relative 1e-5, fp32), and every TP-replicated parameter's gradient equal on the TP ranks."""
    one, many = (json.loads((paths.root / "tp_check" / f"tp{tp}.json").read_text())["engine"]["thd"]
                 for tp in (1, profile.actor_tp))
    loss = abs(many["loss"] - one["loss"]) / abs(one["loss"])
    norm = abs(many["grad_norm"] - one["grad_norm"]) / abs(one["grad_norm"])
    spread = many["replicated_grad_spread"]
    ok = loss <= 1e-5 and norm <= 1e-5 and many["sequence_parallel"] and not spread["over_1e-6"]
    return ok, (f"loss {one['loss']:.6f} / {many['loss']:.6f}, grad norm {one['grad_norm']:.6f} / "
                f"{many['grad_norm']:.6f} (relative {loss:.1e}, {norm:.1e} <= 1e-5); sequence parallel "
                f"{many['sequence_parallel']}; replicated grads differing across TP ranks: {spread['over_1e-6'] or 'none'}")


def direct_response_logprobs(model, input_ids, n_response: int, multi_modal_inputs, image_token_id: int,
                             device: str = "cpu"):
    """Independent reference: the sample alone, transformers computing its own mrope, float64 log-softmax."""
    import torch

    ids = input_ids.to(device)[None]
    kwargs = {}
    if multi_modal_inputs:
        kwargs = {k: v.to(device) for k, v in dict(multi_modal_inputs).items() if k in ("pixel_values", "image_grid_thw")}
        kwargs["mm_token_type_ids"] = (ids == image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits[0].double().cpu()
    log_probs = torch.log_softmax(logits[:-1], -1).gather(-1, input_ids[1:, None].cpu())[:, 0]
    return log_probs[len(input_ids) - 1 - n_response :]


def _k3_rows(rows: list[dict]):
    """(sum of K3 over the gated-on tokens, their count, the gated-on samples) in float64."""
    import torch

    from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE

    total, tokens, on = 0.0, 0, 0
    for row in rows:
        if not row["gate"]:
            continue
        on += 1
        mask = row["response_mask"].bool()
        if row["kl_start"] is not None:
            mask &= torch.arange(len(mask)) >= row["kl_start"]
        weight = row["rollout_is_weights"].double() if row["rollout_is_weights"] is not None else 1.0
        k3 = k3_reference(row["teacher"].double() - row["student"].double(), K3_LINEAR_ABOVE, K3_CLAMP_BELOW) * weight
        total += k3[mask].sum().item()
        tokens += int(mask.sum())
    return total, tokens, on


def _check_k3(m: dict, rows: list[dict], tolerance: float) -> tuple[bool, str]:
    want, tokens, _ = _k3_rows(rows)
    got, got_tokens = m["actor/mopd/k3_sum_kl_on"], m["actor/mopd/kl_on_tokens"]
    rel = abs(got - want) / max(abs(want), 1e-12)
    ok = rel <= tolerance and int(round(got_tokens)) == tokens and tokens > 0
    weights = [row["rollout_is_weights"][row["response_mask"].bool()] for row in rows
               if row["gate"] and row["rollout_is_weights"] is not None]
    spread = (f"; IS weights {min(float(w.min()) for w in weights):.3f}..{max(float(w.max()) for w in weights):.3f}"
              if weights else "; no IS weights")
    return ok, (f"actor {got:.6g} over {got_tokens:.0f} tokens (mean {m['actor/mopd/k3_mean_kl_on']:.4f}); "
                f"float64 {want:.6g} over {tokens} tokens; relative error {rel:.1e} <= {tolerance:g}{spread}")


def _check_loss_terms(m: dict, rows: list[dict], config: dict, tolerance: float) -> tuple[bool, str]:
    """beta and the normalization pinned: ``actor/distillation/loss`` is the float64 K3 sum of the dumps over
    the response tokens (``normalization: all``; the counted ones with ``kept``), and ``actor/loss`` is
    ``actor/pg_loss + beta * actor/distillation/loss``, beta the run's ``distillation_loss_coef``."""
    beta = float(config["distillation"]["distillation_loss"]["distillation_loss_coef"])
    normalization = config["mopd"]["normalization"]
    k3_sum, on_tokens, _ = _k3_rows(rows)
    tokens = on_tokens if normalization == "kept" else sum(int(row["response_mask"].sum()) for row in rows)
    want = k3_sum / max(tokens, 1)
    got = m["actor/distillation/loss"]
    rel = abs(got - want) / max(abs(want), 1e-12)
    total = m["actor/pg_loss"] + beta * got
    gap = abs(m["actor/loss"] - total) / max(abs(m["actor/pg_loss"]), abs(beta * got), 1e-12)
    ok = rel <= tolerance and gap <= 1e-6 and tokens > 0
    return ok, (f"distillation loss {got:.6g} = K3 sum {k3_sum:.6g} / {tokens} tokens ({normalization}) = {want:.6g} "
                f"(relative {rel:.1e}); loss {m['actor/loss']:.6g} = pg {m['actor/pg_loss']:.6g} + {beta:g} x "
                f"{got:.6g} (relative {gap:.1e})")


def _check_gate(m: dict, rows: list[dict]) -> tuple[bool, str]:
    _, _, on = _k3_rows(rows)
    driver = m["mopd/kl_mask_on_fraction"]
    actor = m["actor/mopd/kl_on_samples"] / len(rows)
    ok = abs(actor - driver) < 1e-9 and abs(on / len(rows) - driver) < 1e-9
    return ok, f"driver {driver:.4f}, actor {actor:.4f} ({m['actor/mopd/kl_on_samples']:.0f} of {len(rows)} samples)"


#: the score of a fully correct action (the UI-MOPD reward's +1 level), which makes ``acc`` 1
FULLY_CORRECT = 1.0


def run_config(paths: Paths) -> dict:
    """The stage-2 config the trainer ran with, as Hydra saved it (``outputs/<date>/<time>/.hydra``)."""
    from omegaconf import OmegaConf

    saved = sorted((paths.stage2 / "outputs").glob("*/*/.hydra/config.yaml"))
    if not saved:
        raise FileNotFoundError(f"no .hydra/config.yaml under {paths.stage2 / 'outputs'}")
    return OmegaConf.to_container(OmegaConf.load(saved[0]), resolve=False)


def _check_gate_value(rows: list[dict], mopd: dict) -> tuple[bool, str]:
    """The stored gate against the gate recomputed here from the dumped scores and groups, in float64:
    KL on for every rollout of a group whose mean ``gate_metric`` is at most ``tau_kl``, off otherwise."""
    metric, tau = mopd["gate_metric"], float(mopd["tau_kl"])
    if metric not in ("acc", "rm_scores"):
        return False, f"gate_metric {metric!r}: the smoke recomputes 'acc' and 'rm_scores' only"
    groups: dict[str, list[float]] = {}
    for row in rows:
        value = float(row["score"] == FULLY_CORRECT) if metric == "acc" else float(row["score"])
        groups.setdefault(row["uid"], []).append(value)
    means = {uid: math.fsum(values) / len(values) for uid, values in groups.items()}
    wrong = [row for row in rows if (row["gate"] > 0) != (means[row["uid"]] <= tau)]
    on = sum(row["gate"] > 0 for row in rows)
    boundary = sum(mean == tau for mean in means.values())
    return not wrong and bool(rows), (
        f"KL on for {on} of {len(rows)} samples; recomputed (group mean {metric} <= {tau:g}): "
        f"{sum(means[row['uid']] <= tau for row in rows)}; {len(wrong)} differ; "
        f"{len(groups)} groups, {boundary} exactly at tau_kl")


def _check_pg(rows: list[dict]) -> tuple[bool, str]:
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(row["uid"], []).append(row["score"])
    mixed = [g for g in groups.values() if max(g) > min(g)]
    advantage = max(float(row["advantages"].abs().max()) for row in rows)
    ok = bool(mixed) and advantage > 0
    levels = sorted({s for g in groups.values() for s in g})
    return ok, (f"{len(mixed)} of {len(groups)} groups with mixed rewards (levels {levels}); "
                f"max |advantage| {advantage:.3g}")


def _check_grad_norm(m: dict) -> tuple[bool, str]:
    norm = m["actor/grad_norm"]
    return math.isfinite(norm) and norm > 0, f"actor/grad_norm {norm:.3g}"


#: relative tolerance of the per-platform metrics (float32 means of a few values)
PLATFORM_METRIC_TOLERANCE = 1e-6


def _check_platform_metrics(m: dict, rows: list[dict]) -> tuple[bool, str]:
    """Each platform's metrics, recomputed here from the step's dumped samples (padding left out): the
    fraction with KL on, the mean summed reward, the mean response length, and the teacher group's count
    of the platform's samples."""
    want: dict[str, float] = {}
    for p in PLATFORMS:
        mine = [row for row in rows if row["platform"] == p]
        n = max(len(mine), 1)
        want[f"mopd/kl_mask_on_fraction/{p}"] = math.fsum(row["gate"] > 0 for row in mine) / n
        want[f"mopd/reward_mean/{p}"] = math.fsum(row["score"] for row in mine) / n
        want[f"mopd/response_length/{p}"] = math.fsum(float(row["response_mask"].sum()) for row in mine) / n
        want[f"mopd_teacher/{p}/samples"] = float(len(mine))
    missing = [k for k in want if k not in m]
    if missing:
        return False, "missing " + ", ".join(missing)
    wrong = [f"{k} {m[k]:.6g} (recomputed {v:.6g})" for k, v in want.items()
             if abs(m[k] - v) > PLATFORM_METRIC_TOLERANCE * max(abs(v), 1.0)]
    counts = [want[f"mopd_teacher/{p}/samples"] for p in PLATFORMS]
    return not wrong and all(counts), ("; ".join(
        f"{p}: reward {m[f'mopd/reward_mean/{p}']:+.2f}, KL on {m[f'mopd/kl_mask_on_fraction/{p}']:.2f}, "
        f"length {m[f'mopd/response_length/{p}']:.1f}, teacher samples {m[f'mopd_teacher/{p}/samples']:.0f}"
        for p in PLATFORMS) + (f"; differ: {', '.join(wrong)}" if wrong else "; all = recomputed"))


def _check_syncs(paths: Paths, metrics: dict[int, dict]) -> tuple[bool, str]:
    """After every weight sync, the rollout's weights against the actor engine's own parameters at that step
    (``dumps/actor_state.jsonl``, ``hooks.dump_actor_state``; stale weights sent intact differ there), and
    what the rollout holds against what was sent (sha256 of each tensor: the transport)."""
    from verl_mopd.trainer.hooks import ACTOR_STATE_FILE, compare_weight_stats

    log = paths.stage2 / "rollout_sync.jsonl"
    if not log.exists():  # GPU profile: SGLang holds the weights; compare log-probs instead
        worst = max(m["training/rollout_probs_diff_max"] for m in metrics.values())
        return worst < 0.1, f"no hf rollout: max |rollout - actor| log-prob {worst:.3g} < 0.1 (bfloat16 SGLang)"
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    state = paths.stage2 / "dumps" / ACTOR_STATE_FILE
    actor: dict[int, list[dict]] = {}
    for line in (state.read_text().splitlines() if state.exists() else []):
        if line.strip():
            record = json.loads(line)
            actor.setdefault(record["global_steps"], []).append(record["params"])
    torn = [r["global_steps"] for r in records if r["sent"] != r["held"]]
    stale, missing, seen, detail = [], [], {}, ""
    for record in records:  # the k-th sync of a global_steps value pairs with the k-th actor state of it
        key = (record["global_steps"], record["replica"])
        k = seen[key] = seen.get(key, -1) + 1
        states = actor.get(record["global_steps"], [])
        if k >= len(states) or "held_stats" not in record:
            missing.append(record["global_steps"])
            continue
        ok, detail = compare_weight_stats(states[k], record["held_stats"])
        if not ok:
            stale.append(record["global_steps"])
    ok = len(records) >= STAGE2_STEPS and not torn and not stale and not missing
    names = len(records[0]["held"]) if records else 0
    return ok, (f"{len(records)} syncs: the rollout's weights = the actor engine's own parameters at that step "
                f"(last: {detail}); sha256 of all {names} tensors sent = held"
                + (f"; differ from the actor's at global_steps {stale}" if stale else "")
                + (f"; no actor state for global_steps {missing}" if missing else "")
                + (f"; held differ from sent at global_steps {torn}" if torn else ""))


def _check_resume(paths: Paths) -> tuple[bool, str]:
    records = [json.loads(line) for line in (paths.stage2 / "dumps" / "batching_state.jsonl").read_text().splitlines()]
    saved_end = [r for r in records if r["step"] == RESUME_STEP and r["when"] == "end"]
    resumed_begin = [r for r in records if r["step"] == RESUME_STEP + 1 and r["when"] == "begin"]
    from verl_mopd.batching.sampler import STATE_FILE

    hits = sorted((paths.stage2 / "ckpt").glob(f"*/*/global_step_{RESUME_STEP}"))
    if len(hits) != 1:
        return False, f"expected one global_step_{RESUME_STEP} checkpoint under {paths.stage2 / 'ckpt'}, found {hits}"
    step_folder = hits[0]

    on_disk = json.loads((step_folder / STATE_FILE).read_text())
    if len(saved_end) != 1 or len(resumed_begin) != 1:
        return False, f"state records: {len(saved_end)} at the end of step {RESUME_STEP}, {len(resumed_begin)} at the resume"
    end, begin = saved_end[0], resumed_begin[0]
    ok = end["sampler"] == begin["sampler"] and _same_state(on_disk, end["sampler"]) and \
        end["held_prompts"] == begin["held_prompts"]
    return ok, (f"sampler state at the end of step {RESUME_STEP} = {step_folder.name}/{STATE_FILE} = at the start of "
                f"step {RESUME_STEP + 1}: {ok}; held prompts {len(end['held_prompts'])} -> {len(begin['held_prompts'])}")


def _same_state(on_disk: dict, state: dict) -> bool:
    """``batching_state.json`` may wrap the state with a format version: compare what they share."""
    inner = on_disk.get("state", on_disk) if isinstance(on_disk, dict) else on_disk
    return json.loads(json.dumps(inner, sort_keys=True)) == json.loads(json.dumps(state, sort_keys=True))


# ------------------------------------------------------------------------------------ CLI
def add_smoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: verl's trainers on the CPU harness (default); cuda: one GPU, Megatron-Core and SGLang")
    parser.add_argument("--engine", choices=list(ENGINES), default="megatron",
                        help="verl's training engine: megatron, the recipes' own layouts (default); fsdp: verl's FSDP "
                             "engine with hf teachers (CPU only)")
    parser.add_argument("--out", help="folder for everything the run leaves (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each trainer process may run (default 900)")
    parser.add_argument("--warmup-steps", type=int, default=150,
                        help="supervised steps (batches of 8) that make the random student write tool calls "
                             "(default 150)")
    parser.add_argument("--recipes", help="the recipes/ui_mopd folder (default: the checkout verl-mopd is installed from)")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="run stage 2's 3 steps in one process, without the restart from the step-2 checkpoint "
                             "and its check (~2.5 minutes less on CPU)")


def run_smoke_command(args: argparse.Namespace) -> int:
    return run_smoke(SmokeConfig(device=args.device, engine=args.engine, out=args.out, timeout=args.timeout,
                                 warmup_steps=args.warmup_steps, recipes=args.recipes, resume=args.resume))
