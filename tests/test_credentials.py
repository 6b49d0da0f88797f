"""``credential_provider`` failures name the provider, and never a secret (guarantee 11, Storage).

S3 is moto's server on loopback; an expired key is the proxy's ``expired_keys`` fault (the store
answers ExpiredToken for requests signed with it). Every provider here answers with secret
values that no message may show.
"""

from __future__ import annotations

import functools
import gc
import re
import uuid
from typing import Any

import pytest
from helpers import write_dataset
from proxy import start_proxy
from test_object_stores import Where, read_ids, write_files
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import ArrowStreamDataLoader, StructuredDataset, errors
from arrowstream._storage.credentials import CredentialProvider

SECRET = f"s3cr3t/{uuid.uuid4().hex}"           # the secret key every provider here returns
OPTION_SECRET = f"0pt10n/{uuid.uuid4().hex}"    # a secret in storage_options


def check_clean(error: BaseException) -> str:
    """The error's message, checked to hold no secret value."""
    text = str(error)
    assert SECRET not in text and OPTION_SECRET not in text
    return text


class Keys:
    """A picklable provider: the access key written in ``key_file`` (``RAISE``: it raises, as a token
    refresher does when its source fails)."""

    def __init__(self, key_file: str) -> None:
        self.key_file = key_file

    def __call__(self) -> dict[str, Any]:
        with open(self.key_file) as f:
            key = f.read().strip()
        if key == "RAISE":
            return {}["AWS_SESSION_TOKEN"]
        return {"key": key, "secret": SECRET}


def answer(value: Any) -> Any:
    return value


@pytest.fixture(scope="module")
def s3_path(s3_server):
    return write_files(Where(s3_server.url(f"creds-{uuid.uuid4().hex[:8]}"), s3_server.storage_options, "s3"))


@pytest.fixture
def via_proxy(s3_server):
    """A proxy in front of the server, and the options that reach it without credentials (the provider's)."""
    with start_proxy(s3_server.endpoint) as proxy:
        options = {k: v for k, v in s3_server.options_via(proxy.endpoint).items() if k not in ("key", "secret")}
        yield proxy, options


def test_a_provider_that_raises_is_named_at_build(s3_server, s3_path, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("RAISE")
    options = {k: v for k, v in s3_server.storage_options.items() if k not in ("key", "secret")}
    with pytest.raises(errors.FileReadError) as info:
        StructuredDataset(s3_path, storage_options=options, credential_provider=Keys(str(key_file)))
    text = check_clean(info.value)
    assert text.startswith(f"credential_provider {__name__}.Keys raised KeyError: 'AWS_SESSION_TOKEN' while "
                           f"opening the filesystem to list {s3_path}")
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.timeout(120)
def test_a_provider_that_raises_in_a_worker_or_while_refreshing_is_named(s3_path, tmp_path, via_proxy):
    proxy, options = via_proxy
    key_file = tmp_path / "key"
    key_file.write_text("AKIAGOODGOODGOOD")
    provider = Keys(str(key_file))
    loader, dataset = StructuredDataset.create_dataloader(s3_path, num_workers=1, batch_size=100,
                                                          storage_options=options, credential_provider=provider)
    key_file.write_text("RAISE")       # the worker's first call raises
    dataset.set_epoch(0)
    with pytest.raises(errors.FileReadError) as in_worker:
        list(loader)
    assert f"credential_provider {__name__}.Keys raised KeyError: 'AWS_SESSION_TOKEN' while opening the s3:// " \
           "filesystem in DataLoader worker 0" in check_clean(in_worker.value)
    in_worker = loader = dataset = None     # the worker shuts down here (about 5 s: torch's join timeout), not later
    gc.collect()

    # in this process: its filesystem (opened with the good key at planning) meets an expired key, and asking
    # the provider again raises
    key_file.write_text("AKIAGOODGOODGOOD")
    loader, dataset = StructuredDataset.create_dataloader(s3_path, num_workers=0, batch_size=100, read_ahead=0,
                                                          storage_options=options, credential_provider=provider)
    proxy.configure(expired_keys=["AKIAGOODGOODGOOD"])
    key_file.write_text("RAISE")
    with pytest.raises(errors.FileReadError) as refreshing:
        read_ids(loader, dataset)
    text = check_clean(refreshing.value)
    assert text.startswith(f"credential_provider {__name__}.Keys raised KeyError: 'AWS_SESSION_TOKEN' while "
                           f"refreshing credentials for {s3_path}/part-")
    assert isinstance(refreshing.value.__cause__, KeyError)


@pytest.mark.parametrize(("answer_value", "error", "pattern"), [
    (["key"], errors.ArgumentTypeError, r"must return a dict of storage options, got list"),
    ({1: "x"}, errors.ArgumentTypeError, r"returned a dict with keys that are not str \(int\)"),
    ({"key": "AKIAGOODGOODGOOD", "secret": SECRET, "bogus_key": 1}, errors.InvalidArgumentError,
     r"returned key\(s\) the s3 backend does not take: 'bogus_key' \(int\) \(TypeError: .*unexpected keyword "),
    ({"key": 12345, "secret": SECRET}, errors.ArgumentTypeError,
     (r"returned options the s3 backend cannot use \(TypeError: .*\) for s3://.*; check 'key' \(int\); it returned "
      r"'key' \(int\), 'secret' \(str\)")),
    ({"key": None, "secret": SECRET}, errors.ArgumentTypeError,
     r"returned options the s3 backend cannot use \(PartialCredentialsError: .*\) for s3://.*; check 'key' \(NoneType\)"),
], ids=["list", "int-key", "unknown-key", "int-value", "none-value"])
def test_a_bad_answer_is_the_providers_fault_not_a_listing_failure(s3_server, s3_path, answer_value, error,
                                                                    pattern):
    options = {k: v for k, v in s3_server.storage_options.items() if k not in ("key", "secret")}
    provider = functools.partial(answer, answer_value)
    with pytest.raises(error) as info:
        StructuredDataset(s3_path, storage_options={**options, "secret": OPTION_SECRET},
                          credential_provider=provider)
    text = check_clean(info.value)
    assert text.startswith(f"credential_provider functools.partial({__name__}.answer)")
    assert "cannot be listed" not in text
    assert info.value.__cause__ is None or not isinstance(info.value.__cause__, errors.ArrowStreamError)
    assert re.search(pattern, text), text


@pytest.mark.timeout(120)
def test_always_expired_credentials_name_the_provider_or_ask_for_one(s3_path, tmp_path, via_proxy):
    proxy, options = via_proxy
    key_file = tmp_path / "key"
    key_file.write_text("AKIAOLDOLDOLDOLD")
    proxy.configure(expired_keys=["AKIAOLDOLDOLDOLD"])
    with pytest.raises(errors.FileReadError) as listing:           # planning: the listing
        StructuredDataset(s3_path, storage_options=options, credential_provider=Keys(str(key_file)))
    assert check_clean(listing.value).startswith(
        f"{s3_path}: credential_provider {__name__}.Keys returned expired credentials 3 times in a row")
    assert "pass credential_provider=" not in str(listing.value)
    assert proxy.stats()["injected"]["expired"] == 4                 # the first answer and 3 more

    proxy.configure()
    key_file.write_text("AKIANEWNEWNEWNEW")
    loader, dataset = StructuredDataset.create_dataloader(s3_path, num_workers=0, batch_size=100, read_ahead=0,
                                                          storage_options=options, credential_provider=Keys(str(key_file)))
    proxy.configure(expired_keys=["AKIANEWNEWNEWNEW", "AKIAOLDOLDOLDOLD"])
    key_file.write_text("AKIAOLDOLDOLDOLD")
    with pytest.raises(errors.FileReadError) as reading:             # reading: the provider keeps a stale key
        read_ids(loader, dataset)
    text = check_clean(reading.value)
    assert f"/part-0.parquet: credential_provider {__name__}.Keys returned expired credentials 3 times in a row" in text
    assert "pass credential_provider=" not in text

    without = {**options, "key": "AKIAOLDOLDOLDOLD", "secret": OPTION_SECRET}   # no provider: the hint stays
    with pytest.raises(errors.FileReadError, match=r"credentials expired .*pass credential_provider=") as listing:
        StructuredDataset(s3_path, storage_options=without)
    check_clean(listing.value)
    proxy.configure()
    loader, dataset = StructuredDataset.create_dataloader(s3_path, num_workers=0, batch_size=100, read_ahead=0,
                                                          storage_options=without)
    proxy.configure(expired_keys=["AKIAOLDOLDOLDOLD"])
    with pytest.raises(errors.FileReadError, match=r"credentials expired .*pass credential_provider=") as reading:
        read_ids(loader, dataset)
    check_clean(reading.value)


@pytest.mark.timeout(120)
def test_an_unpicklable_provider_is_refused_for_spawn_and_forkserver_workers(tmp_path):
    path = write_dataset(tmp_path / "data", [(50, 25)])
    provider = lambda: {"key": "AKIAGOODGOODGOOD"}  # what users write
    with pytest.raises(errors.InvalidArgumentError) as early:   # before planning: the path does not even exist
        StructuredDataset.create_dataloader(str(tmp_path / "missing"), num_workers=2, credential_provider=provider,
                                            multiprocessing_context="spawn")
    text = str(early.value)
    assert text.startswith(f"credential_provider: {__name__}.test_an_unpicklable_provider_is_refused_for_spawn_and_"
                           "forkserver_workers.<locals>.<lambda> cannot be pickled")
    assert "starts its 2 worker(s) by spawn" in text and "a module-level function, a functools.partial of one" in text

    dataset = StructuredDataset(path, batch_size=10, credential_provider=provider)   # built: fork is fine
    with pytest.raises(errors.InvalidArgumentError, match=r"<lambda> cannot be pickled .* by forkserver"):
        ArrowStreamDataLoader(dataset, num_workers=1, multiprocessing_context="forkserver")
    assert sum(len(b["id"]) for b in ArrowStreamDataLoader(dataset, num_workers=1,
                                                           multiprocessing_context="fork")) == 50
    with pytest.raises(errors.InvalidArgumentError, match=r"<lambda> cannot be pickled .* loader workers started by "
                                                          r"spawn or forkserver receive the dataset by pickle .*; pass "
                                                          r"a module-level function"):
        list(StatefulDataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="forkserver"))

    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=1, batch_size=10,
                                                          credential_provider=functools.partial(answer, {}),
                                                          multiprocessing_context="forkserver")
    dataset.set_epoch(0)
    assert sum(len(b["id"]) for b in loader) == 50      # a partial of a module-level function travels


def test_a_secret_a_backend_echoes_is_hidden():
    """Messages show keys and types, never values; a backend error that echoes a value is scrubbed."""
    provider = CredentialProvider(functools.partial(answer, {"key": "AKIAGOODGOODGOOD", "secret": SECRET}))
    provider.options({"token": OPTION_SECRET}, "while opening the filesystem")
    try:
        raise TypeError(f"cannot sign with {SECRET!r} and {OPTION_SECRET}")
    except TypeError as exc:   # raised here, outside arrowstream and pyarrow: as a backend would
        fault = provider.fault(exc, "for s3://bucket/k", "s3", {"token": OPTION_SECRET})
        expired = provider.expired(exc, "s3://bucket/k", 3)
    assert fault is not None
    assert "cannot sign with '<hidden>' and <hidden>" in check_clean(fault)
    assert "<hidden>" in check_clean(expired)
