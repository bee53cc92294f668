"""The book serves its own JavaScript, so that the static HTML shows widgets and math offline.

Left to its defaults, Jupyter Book's pages load require.js, the ipywidgets HTML manager and
MathJax 3 from CDNs: with no network a reader sees no widgets and no formulas, and a companion to
a paper should outlive its CDNs. ``vendor`` downloads pinned versions of the three from the npm
registry's tarball URLs (no npm needed), checks each tarball against its pinned sha512, keeps it
in a cache outside the build folder, and unpacks the files the pages use into
``<folder>/vendor/``.
``sphinx_settings`` then has Sphinx copy that folder to the root of the HTML
(``html_extra_path``) and point myst-nb's ``nb_ipywidgets_js`` and ``mathjax_path`` at it.
Not ``_static/``: Jupyter Book adds every .js file under a book's ``_static/`` to every page, and
MathJax has a hundred component files that it loads itself, when a page needs them.

When the registry cannot be reached, the build keeps the CDN defaults and says so.
``$NPM_CONFIG_REGISTRY`` (npm's own variable) names a mirror of the registry instead.
"""

import base64
import fnmatch
import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .paths import REPO_ROOT

# Tarballs are kept here, not in a build folder: the tests build into temporary folders.
CACHE_DIR = REPO_ROOT / "_build" / "npm"
REGISTRY = "https://registry.npmjs.org/"
DOWNLOAD_TIMEOUT_S = 120
# Seconds to wait before each further try of a download: a registry that drops one connection
# should not send a build's pages to the CDNs.
DOWNLOAD_RETRIES_S = (2, 8)


@dataclass(frozen=True)
class Package:
    name: str  # the npm name
    version: str
    integrity: str  # the registry's dist.integrity for this version: sha512 of the tarball
    folder: str  # under vendor/
    files: tuple  # fnmatch patterns inside the package ('*' also matches '/')
    script: str  # the file a page loads


PACKAGES = (
    Package(
        "requirejs",
        "2.3.8",
        "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
        "requirejs",
        ("require.js", "package.json"),
        "require.js",
    ),
    # The AMD build of the manager for ipywidgets 8 (controls 5), and the Font Awesome files it
    # asks for next to itself.
    Package(
        "@jupyter-widgets/html-manager",
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        "html-manager",
        (
            "dist/embed-amd.js",
            "dist/embed.js.LICENSE.txt",
            "dist/*.woff2",
            "dist/*.woff",
            "dist/*.ttf",
            "dist/*.eot",
            "dist/*.svg",
            "package.json",
        ),
        "dist/embed-amd.js",
    ),
    # All of es5/: MathJax loads TeX extensions, fonts and the menu's parts on demand.
    Package(
        "mathjax",
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        "mathjax",
        ("es5/*", "LICENSE", "package.json"),
        "es5/tex-mml-chtml.js",
    ),
)


class Unavailable(Exception):
    """The registry could not provide a package: the book falls back to the CDNs."""


class AssetError(RuntimeError):
    """A tarball is not the pinned one, or lacks a file the pages load: the build stops."""


def integrity_of(path):
    """npm's integrity string of a file: 'sha512-' and the base64 digest."""
    digest = hashlib.sha512(Path(path).read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def tarball_url(package):
    """Where the registry serves ``package``'s tarball: <registry>/<name>/-/<name>-<version>.tgz,
    the name without its scope in the file's name (as ``npm pack`` fetches it)."""
    registry = (os.environ.get("NPM_CONFIG_REGISTRY") or REGISTRY).rstrip("/")
    return f"{registry}/{package.name}/-/{package.name.split('/')[-1]}-{package.version}.tgz"


def download(package, destination):
    """Download ``package``'s tarball from the registry into ``destination``; returns its path."""
    url = tarball_url(package)
    path = Path(destination) / url.rsplit("/", 1)[1]
    for wait in (*DOWNLOAD_RETRIES_S, None):
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                with open(path, "wb") as file:
                    shutil.copyfileobj(response, file)
            return path
        # URLError, HTTPError and timeouts are OSErrors; a connection cut short is an
        # HTTPException
        except (OSError, http.client.HTTPException) as error:
            if wait is None:
                tries = len(DOWNLOAD_RETRIES_S) + 1
                reason = getattr(error, "reason", None) or error
                raise Unavailable(f"{url}: {reason} ({tries} tries)") from None
            time.sleep(wait)


def tarball(package, cache=CACHE_DIR):
    """The pinned tarball of ``package``, from the cache or else the registry, checksum
    verified."""
    cache = Path(cache)
    cached = cache / f"{package.folder}-{package.version}.tgz"
    if cached.exists() and integrity_of(cached) == package.integrity:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as folder:
        fetched = download(package, folder)
        found = integrity_of(fetched)
        if found != package.integrity:
            raise AssetError(
                f"{package.name}@{package.version} from the registry has checksum {found}, "
                f"not the pinned {package.integrity}; it was not used"
            )
        fetched.replace(cached)
    return cached


def unpack(package, archive, vendor):
    """Write the files of ``package`` that the pages use to ``vendor/<folder>/``."""
    target = Path(vendor) / package.folder
    written = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            inside = member.name.removeprefix("package/")
            if not member.isfile() or ".." in Path(inside).parts or inside.startswith("/"):
                continue
            if any(fnmatch.fnmatch(inside, pattern) for pattern in package.files):
                path = target / inside
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(tar.extractfile(member).read())
                written += 1
    if not (target / package.script).is_file():
        raise AssetError(f"{package.name}@{package.version} has no {package.script}")
    return written


def vendor(folder, cache=CACHE_DIR, log=print):
    """Put the pinned packages under ``<folder>/vendor/``; True, or False when the registry
    cannot be reached.

    A checksum mismatch raises AssetError: a wrong file is worse than a CDN, so there is no
    fallback.
    """
    vendor_dir = Path(folder) / "vendor"
    if vendor_dir.exists():
        shutil.rmtree(vendor_dir)
    try:
        archives = [(package, tarball(package, cache)) for package in PACKAGES]
    except Unavailable as reason:
        log(
            f"WARNING: cannot fetch the book's JavaScript from the npm registry ({reason}). The "
            "pages will load require.js, the widget manager and MathJax from CDNs, so their "
            "widgets and formulas need a network connection. Let this machine reach the "
            "registry (or set NPM_CONFIG_REGISTRY to a mirror) and build again to make the "
            "book self-contained."
        )
        return False
    for package, archive in archives:
        unpack(package, archive, vendor_dir)
    return True


# An inline script before the widget manager, on pages with widgets.
WIDGET_SETUP_JS = """\
var require = {paths: {"@jupyter-widgets/html-manager/dist": new URL(
  document.documentElement.dataset.content_root + "vendor/html-manager/dist",
  document.baseURI).href}};
window.addEventListener("DOMContentLoaded", function () {
  if (window.MathJax && !window.MathJax.Hub) {
    window.MathJax.Hub = {Queue: function (call) {
      if (window.MathJax.typesetPromise) {
        window.MathJax.typesetPromise([call[2]]).catch(console.warn);
      }
    }};
  }
});"""


def sphinx_settings(folder):
    """Sphinx settings that serve ``<folder>/vendor/`` as ``vendor/`` at the root of the HTML.

    Sphinx puts '_static/' in front of a local script's path, hence the '../'. The inline
    script before require.js does two things the manager cannot do itself. It configures
    require.js with the manager's real location: the manager looks for its Font Awesome files
    next to its module's URL, which require.js otherwise places next to the page. (Opened from
    disk those files still fail, as the manager builds their URL from the page's origin, which
    is 'null' there; no widget here shows an icon.) And it gives MathJax 3 the
    ``MathJax.Hub.Queue`` of MathJax 2 that the manager calls to typeset widget labels:
    without it every labelled widget throws a TypeError.
    """
    scripts = {
        package.folder: f"../vendor/{package.folder}/{package.script}" for package in PACKAGES
    }
    return {
        "html_extra_path": [str(Path(folder).resolve())],
        "nb_ipywidgets_js": {
            "": {"body": WIDGET_SETUP_JS},
            scripts["requirejs"]: {},
            scripts["html-manager"]: {},
        },
        "mathjax_path": scripts["mathjax"],
    }
