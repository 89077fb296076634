"""Real text: the job's `data` names a text or uint16 token file, checked when read; its
samples are deterministic windows, distinct across replicas and microbatches; real
compute trains on them, and a worker without the file says so."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from testbed.common.choices import EmulatedCompute
from testbed.emulator.runtime.coordinator.failure import Failure, RunFailed
from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.wire.messages import Config, Hello, Listening, receive_as
from testbed.emulator.runtime.worker.compute.model import FileCorpus, make_corpus, sample_index
from testbed.errors import InputError
from testbed.job.load import dump_job, load_job, parse_job
from testbed.job.model import DataFile, ModelShape
from testbed.job.tokens import TokenWindows, open_tokens, window_start

TINY = {"model": "tiny"}  # seq_len 32, vocab 256


def words(count: int, seed: int = 0) -> str:
    """English-like text with a non-ASCII letter (two bytes in UTF-8)."""
    pick = random.Random(seed).choice
    vocabulary = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "near",
                  "the", "café", "by", "the", "river"]
    return " ".join(pick(vocabulary) for _ in range(count))


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """book.txt, and tokens.bin holding the same bytes as uint16 token ids."""
    text = words(3000).encode()
    (tmp_path / "book.txt").write_bytes(text)
    np.frombuffer(text, np.uint8).astype("<u2").tofile(tmp_path / "tokens.bin")
    return tmp_path


def test_data_is_a_path_or_a_mapping_relative_to_the_file_naming_it(
        corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topology = str(corpus_dir / "topo.yaml")
    size = (corpus_dir / "book.txt").stat().st_size
    book = DataFile(str(corpus_dir / "book.txt"), "text", size)
    assert load_job(TINY, topology).data is None  # the synthetic corpus
    assert load_job({**TINY, "data": "book.txt"}, topology).data == book
    assert load_job({**TINY, "data": "tokens.bin"}, topology).data == \
        DataFile(str(corpus_dir / "tokens.bin"), "uint16", size)
    (corpus_dir / "tokens.dat").write_bytes((corpus_dir / "tokens.bin").read_bytes())
    mapped = load_job({**TINY, "data": {"path": "tokens.dat", "format": "uint16"}}, topology)
    assert mapped.data == DataFile(str(corpus_dir / "tokens.dat"), "uint16", size)
    job_file = corpus_dir / "jobs" / "job.yaml"  # relative to the job file, not the topology
    job_file.parent.mkdir()
    job_file.write_text("model: tiny\ndata: ../book.txt\n")
    assert load_job(None, None, job_file).data == book
    monkeypatch.chdir(corpus_dir)  # --set: relative to where the command runs
    assert load_job(TINY, "elsewhere/t.yaml", overrides=["data=book.txt"]).data == book
    assert load_job(TINY, "elsewhere/t.yaml", overrides=["data.path=book.txt"]).data == book
    assert load_job({**TINY, "data": "book.txt"}, topology, overrides=["data="]).data is None
    job = load_job({**TINY, "data": "book.txt"}, topology)
    assert parse_job(dump_job(job), "elsewhere.yaml", prefix="") == job  # absolute when dumped


BAD = [
    ({"data": "missing.txt"}, "job.data: cannot read {dir}/missing.txt: No such file or "
     "directory"),
    ({"data": "."}, "job.data: cannot tell the format of {dir} from its extension"),
    ({"data": {"path": ".", "format": "text"}}, "job.data.path: {dir} is not a file"),
    ({"data": "book.md"}, "job.data: cannot tell the format of {dir}/book.md from its "
     "extension (.txt is text, .bin uint16 tokens)"),
    ({"data": {"path": "book.txt", "format": "utf8"}},
     "job.data.format: unknown format 'utf8' (text or uint16)"),
    ({"data": {"path": "book.txt", "encoding": "utf8"}}, "job.data.encoding: unknown key"),
    ({"data": {"format": "text"}}, "job.data.path: missing value"),
    ({"data": 5}, "job.data: expected a mapping, got int 5"),
    ({"data": ""}, "job.data: expected a path, got ''"),
    ({"data": "odd.bin"}, "job.data: {dir}/odd.bin has an odd size (3 bytes): uint16 "
     "tokens take 2 bytes each"),
    ({"data": "short.txt"}, "job.data: {dir}/short.txt: holds 32 tokens; one sequence "
     "needs seq_len + 1 = 33"),
    ({"data": "empty.bin"}, "job.data: {dir}/empty.bin: holds 0 tokens; one sequence "
     "needs seq_len + 1 = 33"),
    ({"data": "book.txt", "model": {"preset": "tiny", "vocab": 255}},
     "job.data: {dir}/book.txt: text is read as bytes (256 token values); model vocab 255 "
     "is too small: set model.vocab to 256 or more"),
    ({"data": "large.bin"}, "job.data: {dir}/large.bin: holds token id 256; model vocab "
     "256 must be above it (set model.vocab)"),
]


@pytest.mark.parametrize(("section", "message"), BAD, ids=range(len(BAD)))
def test_bad_data_is_refused_in_one_line_naming_file_and_key(
        corpus_dir: Path, section: dict[str, object], message: str) -> None:
    (corpus_dir / "odd.bin").write_bytes(b"abc")
    (corpus_dir / "short.txt").write_bytes(b"x" * 32)
    (corpus_dir / "empty.bin").write_bytes(b"")
    np.array([1] * 40 + [256], "<u2").tofile(corpus_dir / "large.bin")
    topology = str(corpus_dir / "topo.yaml")
    with pytest.raises(InputError) as error:
        load_job({**TINY, **section}, topology)
    assert error.value.exit_code == 2 and "\n" not in str(error.value)
    assert str(error.value).startswith(f"{topology}: {message.format(dir=corpus_dir)}"), \
        str(error.value)


def test_a_bad_data_override_is_blamed_on_set(corpus_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(corpus_dir)
    with pytest.raises(InputError, match=rf"^--set: data: cannot read {corpus_dir}/nope.txt"):
        load_job(TINY, "t.yaml", overrides=["data=nope.txt"])
    with pytest.raises(InputError, match=rf"^--set: data: {corpus_dir}/book.txt: text is "
                       r"read as bytes \(256 token values\); model vocab 100 is too small"):
        load_job({"model": {"preset": "tiny", "vocab": 100}}, "t.yaml",
                 overrides=["data=book.txt"])


def test_samples_are_deterministic_and_distinct_until_the_corpus_is_used_up(
        tmp_path: Path) -> None:
    path = tmp_path / "counting.bin"
    np.arange(1000, dtype="<u2").tofile(path)  # each window known by its first token
    seq_len = 8
    windows = TokenWindows(open_tokens(str(path), "uint16"), seq_len, seed=3)
    count = 999 // seq_len  # windows seq_len apart, each seq_len + 1 long
    epoch = [windows.sample(i) for i in range(count)]
    for sample in epoch:
        assert sample.tolist() == list(range(sample[0], sample[0] + seq_len + 1))
    assert sorted(int(s[0]) for s in epoch) == list(range(0, count * seq_len, seq_len))
    assert [int(s[0]) for s in epoch] != sorted(int(s[0]) for s in epoch)  # shuffled
    again = TokenWindows(open_tokens(str(path), "uint16"), seq_len, seed=3)
    assert all(np.array_equal(again.sample(i), epoch[i]) for i in range(count))
    second = [window_start(count + i, 3, 1000, seq_len) for i in range(count)]
    assert sorted(second) == sorted(int(s[0]) for s in epoch)  # the next epoch, anew
    assert second != [int(s[0]) for s in epoch]
    other_seed = [window_start(i, 4, 1000, seq_len) for i in range(count)]
    assert other_seed != [int(s[0]) for s in epoch]
    # replicas and microbatches take distinct samples as sample_index lays them out
    firsts = {int(windows.sample(sample_index(it, r, j, 2, 3, 4) + e)[0])
              for it in range(2) for r in range(2) for j in range(3) for e in range(4)}
    assert len(firsts) == 48


def test_a_text_file_and_a_uint16_file_read_the_same_tokens(corpus_dir: Path) -> None:
    text = (corpus_dir / "book.txt").read_bytes()
    assert "é".encode() in text  # a byte per token: é is two of them
    book = load_job({**TINY, "data": "book.txt"}, str(corpus_dir / "t.yaml"))
    ids = load_job({**TINY, "data": "tokens.bin"}, str(corpus_dir / "t.yaml"))
    assert book.data is not None and ids.data is not None
    as_text = make_corpus(book.model, 7, book.data)
    as_ids = make_corpus(ids.model, 7, ids.data)
    for index in (0, 1, 5, 500):
        start = window_start(index, 7, len(text), 32)
        expected = torch.tensor(list(text[start : start + 33]))
        assert torch.equal(as_text.sample(index), expected)
        assert torch.equal(as_ids.sample(index), expected)
    inputs, targets = as_text.batch(3, 2)
    assert torch.equal(inputs[0], as_text.sample(3)[:-1])
    assert torch.equal(targets[1], as_text.sample(4)[1:])


def _config(data: DataFile | None, stage: int = 0) -> Config:
    """One replica of a one-stage byte-level model (real compute)."""
    return Config(
        index=0, gpu="east-0", dc="east", address="127.0.0.1", replica=0, stages=[stage],
        programs=[[]], cycle=[], neighbours={}, collectives=[], arbitrated=[], iterations=1,
        compute="real", model=ModelShape(2, 32, 2, 16, 256), layers=[2], seed=0, dp=1,
        microbatches=2, microbatch_size=4, activation_bytes=0,
        emulated={}, local_rank=0, data=data)


def test_the_real_engine_trains_on_the_file(corpus_dir: Path) -> None:
    from testbed.emulator.runtime.worker.compute.real_engine import real_engines

    path = corpus_dir / "book.txt"
    data = DataFile(str(path), "text", path.stat().st_size)
    engine = real_engines(_config(data))[0]
    inputs, _ = engine._tokens(1, 1)
    expected, _ = FileCorpus(data, 16, 0).batch(sample_index(1, 0, 1, 1, 2, 4), 4)
    assert torch.equal(inputs, expected)  # the file's bytes, as the layout numbers them
    losses = []
    for iteration in range(30):
        for microbatch in range(2):
            engine.forward(iteration, microbatch, None)
            engine.backward(iteration, microbatch, None)
        engine.step()
        loss = engine.take_loss()
        assert loss is not None
        losses.append(loss)
    assert losses[-1] < losses[0] - 1.0, losses  # ln 256 = 5.5 at the start
    with open(path, "ab") as handle:
        handle.write(b"more")  # not the file the job was checked against
    with pytest.raises(Exception, match=r"cannot be used on this machine: .*book.txt holds "
                       rf"{data.tokens + 4} tokens, not the {data.tokens}"):
        real_engines(_config(data))[0]


def test_a_worker_without_the_data_file_names_its_machine_and_the_path(tmp_path: Path) -> None:
    """The coordinator's start-up exchange with a real worker on machine m2 that lacks the
    file (a socket pair for the control connection)."""
    from testbed.emulator.runtime.coordinator.control_server import read_from
    from testbed.emulator.runtime.worker.process import serve_on
    from testbed.errors import TestbedError

    missing = str(tmp_path / "book.txt")

    async def scenario() -> tuple[str, list[BaseException | int]]:
        left, right = socket.socketpair()
        worker_side = await asyncio.open_connection(sock=left)
        reader, writer = await asyncio.open_connection(sock=right)
        worker = asyncio.create_task(serve_on(*worker_side, "east-0", "ab" * 32))
        hello = await receive_as(reader, Hello)
        handle = WorkerHandle(0, hello.gpu, 0, 0, machine="m2", reader=reader, writer=writer)
        await handle.tell(_config(DataFile(missing, "text", 1000)))
        with pytest.raises(RunFailed) as failed:
            await asyncio.wait_for(read_from(handle, Failure(), Listening), 30)
        ended = await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
        writer.close()
        return str(failed.value), ended

    failed, ended = asyncio.run(scenario())
    assert failed == (
        f"worker east-0 (replica 0, stage 0) on machine m2: cannot start: the job's data "
        f"cannot be used on this machine: cannot read {missing}: No such file or directory "
        "(a run across machines needs it at the same path on each)")
    assert isinstance(ended[0], TestbedError)  # and the worker ends


def test_only_real_compute_workers_are_given_the_data(corpus_dir: Path) -> None:
    from testbed.emulator.runtime.coordinator.run_config import RunConfig
    from testbed.emulator.runtime.coordinator.worker_setup import worker_config
    from testbed.experiments.inputs import load_inputs
    from testbed.experiments.planning import plan_with_simulator
    from testbed.policy import training_policy

    root = Path(__file__).resolve().parent.parent
    inputs = load_inputs(root / "topologies" / "two-dc.yaml",
                         sets=(f"data={corpus_dir / 'book.txt'}",))
    assert inputs.job.data is not None
    chosen = training_policy("1f1b")
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    handles = [WorkerHandle(r * plan.pp + s, plan.lead_gpu(r, s), r, s)
               for r in range(plan.dp) for s in range(plan.pp)]
    computes: tuple[EmulatedCompute, ...] = ("real", "emulated")
    for compute, given in zip(computes, (inputs.job.data, None), strict=True):
        run = RunConfig(inputs.topology, inputs.job, plan, chosen, compute, corpus_dir / "l")
        for handle in handles:
            assert worker_config(run, handle, handles, lambda _g: "10.0.0.1", ()).data == given


def test_validate_shows_the_data_and_refuses_a_bad_file_in_one_line(corpus_dir: Path) -> None:
    from tests.test_cli import TOPOLOGIES, call

    two_dc = str(TOPOLOGIES / "two-dc.yaml")
    code, out, err = call(["validate", two_dc, "--set", f"data={corpus_dir / 'tokens.bin'}"])
    size = (corpus_dir / "tokens.bin").stat().st_size // 2
    assert code == 0, err
    assert f"  data: {corpus_dir / 'tokens.bin'} (uint16, {size:,} tokens)\n" in out
    assert "  data: synthetic (seeded)\n" in call(["validate", two_dc])[1]
    code, out, err = call(["validate", two_dc, "--set", f"data={corpus_dir / 'none.txt'}"])
    assert (code, out) == (2, "")
    assert err == (f"testbed: error: --set: data: cannot read {corpus_dir / 'none.txt'}: "
                   "No such file or directory\n")
