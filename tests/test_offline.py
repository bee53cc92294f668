"""The book's vendored JavaScript: pinned, checksummed, cached, fetched from the npm registry
without npm, and a CDN fallback without the registry."""

import base64
import hashlib
import io
import tarfile
import urllib.error

import pytest

from toycore import book, offline


def _tarball(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _package(integrity="sha512-x"):
    return offline.Package("demo", "1.0.0", integrity, "demo", ("es5/*", "LICENSE"), "es5/main.js")


def test_integrity_is_npms_sha512_in_base64(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert (
        offline.integrity_of(path)
        == "sha512-" + base64.b64encode(hashlib.sha512(b"abc").digest()).decode()
    )


def test_unpack_writes_only_the_listed_files_and_nothing_outside(tmp_path):
    archive = _tarball(
        tmp_path / "demo.tgz",
        {
            "package/es5/main.js": b"main",
            "package/es5/a/b.js": b"b",
            "package/LICENSE": b"MIT",
            "package/src/x.ts": b"x",
            "package/../escape.js": b"no",
        },
    )
    assert offline.unpack(_package(), archive, tmp_path / "vendor") == 3
    written = sorted(
        p.relative_to(tmp_path / "vendor").as_posix()
        for p in (tmp_path / "vendor").rglob("*")
        if p.is_file()
    )
    assert written == ["demo/LICENSE", "demo/es5/a/b.js", "demo/es5/main.js"]
    assert not (tmp_path / "escape.js").exists()


def test_a_tarball_with_the_wrong_checksum_is_refused_and_not_cached(tmp_path, monkeypatch):
    def fake_pack(package, destination):
        return _tarball(tmp_path / "fetched.tgz", {"package/es5/main.js": b"tampered"})

    monkeypatch.setattr(offline, "download", fake_pack)
    with pytest.raises(
        offline.AssetError,
        match="demo@1.0.0 from the registry has checksum sha512-.*not the pinned",
    ):
        offline.tarball(_package(), tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_good_tarball_is_cached_and_then_used_without_the_registry(tmp_path, monkeypatch):
    good = _tarball(tmp_path / "good.tgz", {"package/es5/main.js": b"main"})
    package = _package(offline.integrity_of(good))
    monkeypatch.setattr(offline, "download", lambda package, destination: good)
    cached = offline.tarball(package, tmp_path / "cache")
    assert cached.parent == tmp_path / "cache" and offline.integrity_of(cached) == package.integrity

    def no_download(package, destination):
        raise AssertionError("the registry was asked although the cache holds the tarball")

    monkeypatch.setattr(offline, "download", no_download)
    assert offline.tarball(package, tmp_path / "cache") == cached


def test_the_tarball_urls_are_the_registrys(monkeypatch):
    monkeypatch.delenv("NPM_CONFIG_REGISTRY", raising=False)
    assert [offline.tarball_url(package) for package in offline.PACKAGES] == [
        "https://registry.npmjs.org/requirejs/-/requirejs-2.3.8.tgz",
        "https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz",
        "https://registry.npmjs.org/mathjax/-/mathjax-3.2.2.tgz",
    ]
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "https://mirror.example/npm/")
    assert offline.tarball_url(offline.PACKAGES[0]).startswith(
        "https://mirror.example/npm/requirejs/"
    )


def test_a_download_is_tried_again_after_a_dropped_connection(tmp_path, monkeypatch):
    tries, waits = [], []

    def flaky(url, timeout):
        tries.append(url)
        if len(tries) < 3:
            raise urllib.error.URLError("connection reset by peer")
        return io.BytesIO(b"tarball")

    monkeypatch.setattr(offline.urllib.request, "urlopen", flaky)
    monkeypatch.setattr(offline.time, "sleep", waits.append)
    path = offline.download(_package(), tmp_path)
    assert path.read_bytes() == b"tarball"
    assert len(tries) == 3 and waits == list(offline.DOWNLOAD_RETRIES_S)


def test_without_the_registry_the_build_falls_back_to_cdns_and_says_so(tmp_path, monkeypatch):
    tries = []

    def unreachable(url, timeout):
        tries.append(url)
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(offline.urllib.request, "urlopen", unreachable)
    monkeypatch.setattr(offline.time, "sleep", lambda seconds: None)
    messages = []
    assert (
        offline.vendor(tmp_path / "offline", tmp_path / "empty-cache", log=messages.append) is False
    )
    assert not (tmp_path / "offline" / "vendor").exists()
    assert len(messages) == 1 and "no route to host" in messages[0] and "CDN" in messages[0]
    assert len(tries) == len(offline.DOWNLOAD_RETRIES_S) + 1  # the first package, tried again


def test_the_settings_point_every_script_at_the_vendored_files(tmp_path):
    settings = offline.sphinx_settings(tmp_path)
    assert settings["html_extra_path"] == [str(tmp_path.resolve())]
    # Sphinx serves a local script from '_static/<path>'; '../' leads back to the root.
    scripts = [path for path in settings["nb_ipywidgets_js"] if path] + [settings["mathjax_path"]]
    assert scripts == [
        "../vendor/requirejs/require.js",
        "../vendor/html-manager/dist/embed-amd.js",
        "../vendor/mathjax/es5/tex-mml-chtml.js",
    ]
    assert list(settings["nb_ipywidgets_js"])[0] == ""  # the inline set-up comes first


def test_a_bad_tarball_stops_the_build_before_any_chapter_runs(tmp_path, monkeypatch):
    def refuse(folder, log):
        raise offline.AssetError("mathjax@3.2.2 from the registry has checksum sha512-bad")

    monkeypatch.setattr(offline, "vendor", refuse)
    with pytest.raises(book.BuildError, match="sha512-bad"):
        book.build("ci", tmp_path, log=lambda message: None)
    assert list((tmp_path / "source" / "chapters").iterdir()) == []
