"""The reference backend: ``python -m pytest_specenergy.refserver`` for an engine config."""

from __future__ import annotations

import importlib.util
import os
import sys

from pytest_specenergy.engines.base import ENGINE_DRAFTERS
from pytest_specenergy.engines.base import BackendDefaults
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.checkpoints import CheckpointFetchError
from pytest_specenergy.engines.checkpoints import ensure_fetched
from pytest_specenergy.engines.config import EngineConfig


class ReferenceBackend(BackendDefaults):
    """Starts the project's HF transformers server (CPU, or CUDA when asked)."""

    name = "reference"
    # Importing torch and transformers dominates start-up; tiny models build in a second.
    startup_timeout_s = 300.0
    #: ``/generate`` answers ``return_prompt_token_ids`` (without a forward at
    #: ``max_new_tokens=0``): coherence asks it.
    returns_prompt_token_ids = True

    def drafters(self) -> tuple[str, ...]:
        """Drafters the reference server implements."""
        return ENGINE_DRAFTERS["reference"]

    def check(self, config: EngineConfig) -> None:
        """The reference server needs torch and transformers (the ``reference`` extra); a built-in
        checkpoint (target or draft) is fetched into the cache here, before the start-up timeout
        runs."""
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise EngineConfigError(
                f"the reference engine needs {', '.join(missing)}; install them with pip install "
                "'pytest-specenergy[reference]' torch==2.13.0"
            )
        if config.drafter and config.drafter.name not in self.drafters():
            raise EngineConfigError(
                f"the reference engine implements drafters {', '.join(self.drafters())}, not "
                f"{config.drafter.name!r}"
            )
        draft = config.drafter.draft_model if config.drafter else None
        for model in (config.model, draft):
            if not model:
                continue
            try:
                ensure_fetched(model)
            except CheckpointFetchError as exc:
                raise EngineConfigError(str(exc)) from None

    def command(self, config: EngineConfig, host: str, port: int) -> list[str]:
        """The server's argv; the arms' differ only by the drafter flags and faults that act in
        speculation alone."""
        # Servers start with the interpreter running pytest.
        argv = [
            sys.executable,
            "-m",
            "pytest_specenergy.refserver",
            "--model",
            config.model,
            "--dtype",
            config.dtype,
            "--device",
            config.device,
            "--seed",
            str(config.seed),
            "--host",
            host,
            "--port",
            str(port),
        ]
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
        if config.model.startswith("tiny:") and not config.device.startswith("cuda"):
            # A built-in tiny model's ops are too small to split: on 2 cores the hybrid's
            # recurrent kernels ran 5x slower with 2 OpenMP threads than with 1 (dense 1.1x).
            argv += ["--threads", "1"]
        elif workers > 1 and not config.device.startswith("cuda"):
            # xdist workers each run their own CPU servers: split the cores between them, or
            # OpenMP threads of different workers spin against each other.
            argv += ["--threads", str(max(1, (os.cpu_count() or 1) // workers))]
        if config.max_running_requests is not None:
            argv += ["--max-running-requests", str(config.max_running_requests)]
        for fault in config.faults:
            argv += ["--fault", fault]
        drafter = config.drafter
        if drafter is None or drafter.name == "none":
            # The A/A control's "speculative" engine is a second process of the baseline's.
            return argv + ["--drafter", "none"]
        if config.replay == "verify":
            # Draft removal: the same verify width, the drafts each request brings, no draft model.
            return argv + [
                "--drafter",
                "replay",
                "--num-draft-tokens",
                str(drafter.num_draft_tokens),
            ]
        argv += ["--drafter", drafter.name, "--num-draft-tokens", str(drafter.num_draft_tokens)]
        if drafter.name == "block":
            argv += ["--block-size", str(drafter.get("block_size"))]
        if config.replay == "proposals":
            # The drafter's passes run; the verified drafts are the recorded ones (no oracle).
            argv += ["--replay-proposals"]
        elif dict(drafter.settings).get("accept_p") is not None:
            argv += ["--draft-accept-p", repr(drafter.get("accept_p"))]
        if drafter.name == "ngram":
            argv += [
                "--ngram-min-match-window",
                str(drafter.get("min_match_window")),
                "--ngram-max-match-window",
                str(drafter.get("max_match_window")),
            ]
        if drafter.draft_model:
            argv += ["--draft-model", drafter.draft_model]
        return argv

    def environment(self, config: EngineConfig) -> dict[str, str]:
        """Keep torch to the cores pytest leaves free; nothing else differs between arms.

        OpenMP threads that wait passively: by default libgomp spins at every barrier, and on a
        host with more runnable threads than cores (xdist workers, the other arm, other jobs) a
        spinning thread holds the core its descheduled partner needs. smollm2-135m decoded 0.9 to
        1.3 tokens/s at batch 1 with 2 spinning threads on the loaded 2-core machine, 3.5 to 9.8
        with 1 thread, 4.1 to 5.5 with 2 passive ones. Read when OpenMP starts, so it reaches a
        zygote's forks through the zygote's own environment; a value the user set is kept."""
        env = {"TOKENIZERS_PARALLELISM": "false"}
        if not config.device.startswith("cuda") and "OMP_WAIT_POLICY" not in os.environ:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        return env
