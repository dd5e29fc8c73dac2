"""Every SGLang command line the plugin can emit, through SGLang's own parser and validation.

For the newest (0.5.23) and the oldest supported (0.5.9) release, each in its own environment
(``dev/sglang_env.sh``: the real wheel, CPU torch, import-only stand-ins): every drafter x CUDA
graphs on/off x tensor parallel 1/2 is built by the plugin (``SGLangBackend.check`` and
``command``) and handed to ``sglang_worker.py``, which runs SGLang's ``ServerArgs`` parser,
``from_cli_args`` and resolution/``check_server_args`` (``--device cpu``, and on a simulated H200
for the GPU path). One test id per command line and stage. A command line the plugin refuses
itself is asserted as that refusal, and SGLang's parser is shown to refuse it too.
"""

from __future__ import annotations

from typing import Any

import pytest
from sglang_envs import NEWEST
from sglang_envs import OLDEST
from sglang_envs import run_worker
from sglang_envs import sglang_python

from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.sglang import SGLangBackend
from pytest_specenergy.engines.sglang import resolved_args_difference

VERSIONS = (OLDEST, NEWEST)
DRAFTERS = (
    "baseline",
    "ngram",
    "ngram-bfs4",
    "eagle",
    "eagle-tree",
    "eagle3",
    "nextn",
    "draft_model",
    "dflash",
    "dspark",
)
GRAPHS = ("graphs_on", "graphs_off")
TPS = (1, 2)
LINES = [f"{v}-{d}-{g}-tp{tp}" for v in VERSIONS for d in DRAFTERS for g in GRAPHS for tp in TPS]

#: Drafters the plugin refuses on a release, with (part of) its message; SGLang agrees (below).
PLUGIN_REFUSES = {
    OLDEST: {
        "dflash": "SGLang 0.5.9 has no DFLASH speculative algorithm",
        "dspark": "SGLang 0.5.9 has no DSPARK speculative algorithm",
    },
    NEWEST: {},
}
#: What SGLang's own CPU resolution refuses (measured; its messages, not the plugin's).
CPU_REFUSES = {
    OLDEST: {
        "ngram": "Ngram speculative decoding only supports CUDA device",
        "ngram-bfs4": "Ngram speculative decoding only supports CUDA device",
    },
    NEWEST: {
        "dflash": "DFLASH speculative decoding is not supported by CpuSRTPlatform",
        "dspark": "DSpark speculative decoding only supports CUDA, NPU or XPU device",
    },
}


def _drafter(name: str, draft: str) -> Drafter | None:
    return {
        "baseline": None,
        "ngram": Drafter("ngram"),
        "ngram-bfs4": Drafter("ngram", max_bfs_breadth=4),
        "eagle": Drafter("eagle", draft_model=draft),
        "eagle-tree": Drafter("eagle", draft_model=draft, topk=4, num_steps=5, num_draft_tokens=7),
        "eagle3": Drafter("eagle3", draft_model=draft),
        # Without draft_model, NEXTN on a target without MTP layers is refused (issue 20).
        "nextn": Drafter("nextn", draft_model=draft),
        "draft_model": Drafter("draft_model", draft_model=draft),
        "dflash": Drafter("dflash", draft_model=draft),
        "dspark": Drafter("dspark", draft_model=draft),
    }[name]


def plugin_line(line: str, model: str, draft: str) -> dict[str, Any]:
    """The plugin's argv (after ``-m sglang.launch_server``) for one line id, or its refusal."""
    version, rest = line.split("-", 1)
    name, graphs, tp = rest.rsplit("-", 2)
    options: dict[str, Any] = {"sglang_version": version, "python": "python"}
    if graphs == "graphs_off":
        options["disable_cuda_graph"] = True
    if tp != "tp1":
        options["tp_size"] = int(tp[2:])
    config = EngineConfig(
        engine="sglang",
        model=model,
        drafter=_drafter(name, draft),
        options=tuple(sorted(options.items())),
    )
    item: dict[str, Any] = {"id": line, "drafter": name, "graphs": graphs, "tp": tp}
    backend = SGLangBackend()
    try:
        backend.check(config)
        command = backend.command(config, "127.0.0.1", 30000)
    except EngineConfigError as exc:
        item["refused"] = str(exc)
        return item
    assert command[1:3] == ["-m", "sglang.launch_server"], command
    item["argv"] = command[3:]
    return item


@pytest.fixture(scope="session")
def plugin_lines(tiny_models: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """Every line id -> the plugin's argv or refusal (built once)."""
    return {line: plugin_line(line, *tiny_models) for line in LINES}


def _results(plugin_lines: dict[str, dict[str, Any]], version: str, mode: str) -> dict[str, Any]:
    items = [
        {"id": k, "argv": v["argv"]}
        for k, v in plugin_lines.items()
        if k.startswith(version + "-") and "argv" in v
    ]
    return run_worker(version, mode, items)


def _line(plugin_lines: dict[str, dict[str, Any]], line: str) -> tuple[str, dict[str, Any]]:
    item = plugin_lines[line]
    version = line.split("-", 1)[0]
    expected = PLUGIN_REFUSES[version].get(item["drafter"])
    if expected is not None:
        assert "refused" in item, (
            f"{line}: the plugin should refuse it ({expected}); it emitted {item}"
        )
        assert expected in item["refused"], (line, item["refused"])
    else:
        assert "argv" in item, f"{line}: the plugin refused it: {item.get('refused')}"
    return version, item


@pytest.mark.parametrize("line", LINES)
def test_sglang_parser_accepts(plugin_lines, line):
    """``parse_args`` (and ``from_cli_args`` on >= 0.5.14) of SGLang's own ``ServerArgs``."""
    version, item = _line(plugin_lines, line)
    if "refused" in item:
        return  # asserted as the plugin's refusal; SGLang's agreement is the next test
    result = _results(plugin_lines, version, "parse")[line]
    assert result["ok"], (item["argv"], result["error"])
    assert result["stage"] == ("parse" if version == OLDEST else "from_cli_args")


@pytest.mark.parametrize("line", [x for x in LINES if x.split("-", 2)[1] in ("dflash", "dspark")])
def test_plugin_refusals_are_sglang_refusals(plugin_lines, tiny_models, line):
    """Where the plugin refuses a drafter, SGLang's parser of that release refuses its flags."""
    version, item = _line(plugin_lines, line)
    if "refused" not in item:
        assert version == NEWEST  # both exist on the newest release: nothing to agree about
        return
    target, draft = tiny_models
    probes = {
        "dflash": ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft],
        "dspark": [
            "--speculative-algorithm",
            "DSPARK",
            "--speculative-dspark-block-size",
            "6",
            "--speculative-draft-model-path",
            draft,
        ],
    }
    # One worker run for every such line (same probes, so the cached answer is shared).
    results = run_worker(
        version,
        "parse",
        [{"id": name, "argv": ["--model-path", target, *argv]} for name, argv in probes.items()],
    )
    result = results[item["drafter"]]
    assert not result["ok"] and result["error"].startswith("SystemExit(2)"), result


@pytest.mark.parametrize("line", LINES)
def test_sglang_resolves_on_a_simulated_h200(plugin_lines, line):
    """SGLang's full resolution and ``check_server_args`` with the device queries of an H200
    answered (no kernel runs; see sglang_worker.py), and the baseline twin resolves equal
    outside the ``speculative_*`` fields (issue 13 item 1: the decode batch-size list)."""
    version, item = _line(plugin_lines, line)
    if "refused" in item:
        return
    results = _results(plugin_lines, version, "gpu-sim")
    result = results[line]
    assert result["ok"], (result["stage"], result["error"], result.get("where"))
    assert result["stage"] == "check" and result["resolved"]["device"] == "cuda"
    # The plugin's own twin check (measure/checks.py runs it on both arms' /server_info).
    twin = results[f"{version}-baseline-{item['graphs']}-{item['tp']}"]["resolved"]
    assert resolved_args_difference(result["resolved"], twin) == []


@pytest.mark.parametrize("line", LINES)
def test_sglang_cpu_resolution(plugin_lines, line):
    """With ``--device cpu``: resolves and checks, or SGLang itself refuses (its message)."""
    version, item = _line(plugin_lines, line)
    if "refused" in item:
        return
    result = _results(plugin_lines, version, "cpu")[line]
    expected = CPU_REFUSES[version].get(item["drafter"])
    if expected is None:
        assert result["ok"] and result["stage"] == "check", (result["error"], result.get("where"))
        assert result["resolved"]["device"] == "cpu"
    else:
        assert not result["ok"] and expected in result["error"], result["error"]


def test_the_environments_are_the_real_releases_with_cpu_torch():
    """Each environment holds the real wheel it claims, CPU torch, and only stand-ins for
    torchvision and sgl_kernel (a real one would change what these tests exercise).

    Read from the packages' metadata and import paths, importing none of them: the import
    itself (ServerArgs and its resolution) is what the conformance worker and the live
    servers run, and importing SGLang here again cost 12 s per environment."""
    code = (
        "import importlib.metadata as m, importlib.util as u; d = m.distribution('sglang'); "
        "print(d.version, m.version('torch'), "
        "d.locate_file('sglang/srt/server_args.py').is_file(), u.find_spec('sgl_kernel').origin, "
        "u.find_spec('torchvision').origin)"
    )
    import subprocess

    for version in VERSIONS:
        out = subprocess.run(
            [str(sglang_python(version)), "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        assert out[0] == version and out[1].startswith("2.13.0") and "+cpu" in out[1], out
        assert out[2] == "True", out  # the wheel's own files, not metadata alone
        assert all("sglang_standins" in path for path in out[3:]), out
