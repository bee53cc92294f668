"""What readers reach: the publishing workflow, the repository the book links to, Binder's pins."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from bs4 import BeautifulSoup

from toycore import book
from toycore.book import config
from toycore.paths import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
# In requirements.txt but not in binder/requirements.txt: they build the HTML or run the tests,
# and a Binder reader does neither.
BUILD_AND_TEST_ONLY = {
    "jupyter-book",
    "nbval",
    "pytest",
    "ruff",
    "beautifulsoup4",
    "playwright",
    "check-jsonschema",
    "pytest-xdist",
}


def pins(path):
    """{package: version} of a requirements file's ``name==version`` lines."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):  # options (-e ., --extra-index-url) are not pins
            continue
        name, version = line.split("==")
        found[name.lower()] = version
    return found


def test_binder_pins_are_the_projects_pins():
    project = pins(REPO_ROOT / "requirements.txt")
    binder = pins(REPO_ROOT / "binder" / "requirements.txt")
    # The CPU-only wheel is the same release with PyTorch's local label.
    assert binder.pop("torch") == project.pop("torch") + "+cpu"
    for name, version in binder.items():
        assert project.get(name) == version, (
            f"binder pins {name}=={version}, requirements.txt {project.get(name)}"
        )
    left_out = set(project) - set(binder)
    assert left_out == BUILD_AND_TEST_ONLY, (
        "a new requirement: add it to binder/requirements.txt, "
        "or to BUILD_AND_TEST_ONLY if readers never need it"
    )


def test_binder_installs_toycore_in_postbuild_and_warms_the_cache_without_rendering():
    post_build = REPO_ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111, (
        "repo2docker runs postBuild only when it is executable"
    )
    script = post_build.read_text()
    assert "pip install --no-deps -e ." in script
    assert "-e ." not in (REPO_ROOT / "binder" / "requirements.txt").read_text()
    assert re.search(r"python -m toycore\.book .*--no-html", script)


def check_workflow(path):
    """check-jsonschema against the GitHub workflow schema it ships (no network needed)."""
    checker = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(checker), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
    )


def test_the_workflow_passes_the_github_workflow_schema(tmp_path):
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert workflows
    for workflow in workflows:
        result = check_workflow(workflow)
        assert result.returncode == 0, result.stdout + result.stderr
    # the check can fail: a job without runs-on is refused
    broken = yaml.safe_load(workflows[0].read_text())
    for job in broken["jobs"].values():
        job.pop("runs-on", None)
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert check_workflow(tmp_path / "broken.yml").returncode != 0


def test_the_workflow_tests_pull_requests_and_publishes_main_with_the_result_cache():
    workflow = yaml.safe_load((WORKFLOWS / "book.yml").read_text())
    jobs = workflow["jobs"]
    test_steps = [step.get("run", "") for step in jobs["test"]["steps"]]
    assert "make test" in test_steps and "pull_request" in jobs["test"]["if"]
    build = jobs["build"]
    assert "if" not in build, "pull requests build the book too: it is their preview"
    uses = [step.get("uses", "") for step in build["steps"]]
    assert any(u.startswith("actions/cache@") for u in uses)
    cache = next(
        step for step in build["steps"] if step.get("uses", "").startswith("actions/cache@")
    )
    assert cache["with"]["path"] == "_build/cache" and "cache-key" in cache["with"]["key"]
    # the step that names the cache runs (here, with this checkout's toycore)
    naming = next(step["run"] for step in build["steps"] if step.get("id") == "cache-key")
    command = re.search(r"\$\((\.venv/bin/python -c '[^']+')\)", naming)[1]
    named = subprocess.run(
        command.replace(".venv/bin/python", sys.executable, 1),
        shell=True,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert named.returncode == 0 and re.fullmatch(r"[0-9a-f]{16}-cpu-torch\S+\n", named.stdout)
    make_book = next(step for step in build["steps"] if step.get("run", "").startswith("make book"))
    assert make_book["env"]["TOYCORE_REPOSITORY"] == "${{ github.repository }}"
    uploads = {
        step["with"]["name"]: step["if"]
        for step in build["steps"]
        if step.get("uses", "").startswith("actions/upload-artifact@")
    }
    assert uploads == {
        "book-preview": "github.event_name == 'pull_request'",
        "book": "github.event_name != 'pull_request'",
    }
    deploy = jobs["deploy"]
    assert deploy["if"] == "github.event_name != 'pull_request'"
    publish = next(
        step for step in deploy["steps"] if step.get("uses", "").startswith("JamesIves/")
    )
    # main's deploy replaces the pages but keeps the open pull requests' previews
    assert publish["with"]["branch"] == "gh-pages" and publish["with"]["clean"] is True
    assert publish["with"]["clean-exclude"] == f"{PREVIEWS}/"


PREVIEWS = "pr-preview"


def test_previews_are_published_from_the_pull_requests_artifact_and_never_run_its_code():
    preview = yaml.safe_load((WORKFLOWS / "preview.yml").read_text())
    triggers = preview[True]  # YAML reads the key `on` as True
    assert triggers["workflow_run"]["workflows"] == ["book"]
    assert triggers["pull_request_target"]["types"] == ["closed"]
    publish, remove = preview["jobs"]["publish"], preview["jobs"]["remove"]
    assert "github.event.workflow_run.event == 'pull_request'" in publish["if"]
    for job in (publish, remove):
        assert job["concurrency"]["group"] == "gh-pages"
        for step in job["steps"]:
            # the default checkout is main's code (or the base branch's): never the pull request's
            if step.get("uses", "").startswith("actions/checkout@"):
                assert "with" not in step
    download = next(s for s in publish["steps"] if s.get("uses", "").startswith("actions/download"))
    assert download["with"]["name"] == "book-preview"
    deploy = next(s for s in publish["steps"] if s.get("uses", "").startswith("JamesIves/"))
    number = "${{ steps.pull-request.outputs.number }}"
    assert deploy["with"]["target-folder"] == f"{PREVIEWS}/pr-{number}"
    assert deploy["with"]["branch"] == "gh-pages"


def run_removal(tmp_path, number):
    """The remove job's script against a local gh-pages holding the book and two previews:
    the files left on gh-pages afterwards."""
    preview = yaml.safe_load((WORKFLOWS / "preview.yml").read_text())
    script = next(s["run"] for s in preview["jobs"]["remove"]["steps"] if "run" in s)
    script = script.replace("${{ github.event.pull_request.number }}", str(number))

    def git(*args, cwd):
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    origin, pages, clone = tmp_path / "origin.git", tmp_path / "pages", tmp_path / "clone"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    git("init", "-q", "-b", "gh-pages", str(pages), cwd=tmp_path)
    for name in ["index.html", f"{PREVIEWS}/pr-7/index.html", f"{PREVIEWS}/pr-8/index.html"]:
        (pages / name).parent.mkdir(parents=True, exist_ok=True)
        (pages / name).write_text(name)
    git("add", ".", cwd=pages)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "pages", cwd=pages)
    git("push", "-q", str(origin), "gh-pages", cwd=pages)
    git("clone", "-q", str(origin), str(clone), cwd=tmp_path)  # as actions/checkout leaves it
    subprocess.run(["bash", "-e", "-c", script], cwd=clone, check=True, capture_output=True)
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "gh-pages"],
        cwd=origin,
        check=True,
        capture_output=True,
        text=True,
    )
    return set(listed.stdout.split())


def test_closing_a_pull_request_removes_its_preview_and_only_its_own(tmp_path):
    left = run_removal(tmp_path, 7)
    assert left == {"index.html", f"{PREVIEWS}/pr-8/index.html"}


def test_closing_a_pull_request_without_a_preview_changes_nothing(tmp_path):
    left = run_removal(tmp_path, 9)
    assert left == {"index.html", f"{PREVIEWS}/pr-7/index.html", f"{PREVIEWS}/pr-8/index.html"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),
        ({"GITHUB_REPOSITORY": "someone/a-book"}, "someone/a-book"),
        ({"GITHUB_REPOSITORY": "someone/a-book", "TOYCORE_REPOSITORY": "me/my.fork"}, "me/my.fork"),
    ],
)
def test_the_repository_comes_from_toycore_repository_then_github_repository(environ, expected):
    assert config.repository(environ) == expected


@pytest.mark.parametrize("name", ["no-slash", "a/b/c", "https://github.com/a/b", "a/", " a/b"])
def test_a_malformed_repository_is_refused_before_any_work(name, monkeypatch, tmp_path):
    monkeypatch.setenv("TOYCORE_REPOSITORY", name)
    with pytest.raises(ValueError, match="owner/name"):
        book.build("ci", tmp_path / "build")
    assert not (tmp_path / "build").exists()


def render_first_chapter(tmp_path, repository):
    """A one-page book with the project's _config.yml, its page a notebook at chapter 1's path
    (its title only: the buttons are the point), rendered the way ``make book`` renders, for
    the given repository: (the page's HTML, chapter 1's path)."""
    source = tmp_path / "source"
    (source / "chapters").mkdir(parents=True)
    for name in ("_config.yml", "references.bib"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for folder in config.BOOK_FOLDERS:  # the extension _config.yml names
        shutil.copytree(REPO_ROOT / folder, source / folder)
    chapter = config.chapters()[0]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Chapter 1")])
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(notebook, source / "chapters" / chapter.name)
    (source / "_toc.yml").write_text(f"format: jb-book\nroot: chapters/{chapter.stem}\n")
    config.set_repository(source / "_config.yml", repository)
    book.render_html(source, tmp_path)
    return BeautifulSoup(
        (tmp_path / "html" / "chapters" / f"{chapter.stem}.html").read_text(), "html.parser"
    ), chapter


def test_with_a_repository_a_chapter_links_to_it_and_to_binder_jupyterlab(tmp_path):
    page, chapter = render_first_chapter(tmp_path, "someone/a-book")
    links = {a["href"] for a in page.find_all("a", href=True)}
    binder = (
        f"https://mybinder.org/v2/gh/someone/a-book/main?urlpath=lab/tree/chapters/{chapter.name}"
    )
    assert binder in links
    # The notebook the Binder link opens is the committed chapter, at that path in the repository.
    assert (REPO_ROOT / "chapters" / chapter.name).exists()
    assert "https://github.com/someone/a-book" in links
    assert any(link.startswith("https://github.com/someone/a-book/issues") for link in links)
    assert "thebe" not in str(page).lower()  # no Live Code button, no script loading thebe


def test_without_a_repository_a_chapter_has_no_repository_issue_or_launch_buttons(tmp_path):
    page, _ = render_first_chapter(tmp_path, None)
    links = {a["href"] for a in page.find_all("a", href=True)}
    assert not [link for link in links if "github.com" in link or "mybinder" in link]
    assert not page.select(".launch-buttons, .dropdown-launch-buttons")


def test_licences_and_citation_are_there():
    assert "MIT License" in (REPO_ROOT / "LICENSE").read_text()
    assert "CC BY 4.0" in (REPO_ROOT / "LICENSE-TEXT").read_text()
    citation = yaml.safe_load((REPO_ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    assert citation["title"] == yaml.safe_load((REPO_ROOT / "_config.yml").read_text())["title"]
