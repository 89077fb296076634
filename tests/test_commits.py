"""Commit subjects are one line `git log --oneline` can be scanned by: at most 72
characters, the detail in the body (CONTRIBUTING.md). Checked on the commits made after
the one .commit-subject-base records, so that no commit already made has to be reworded:
those after it in history and, by their committer date, not older than it (a branch made
before the rule and merged since keeps its subjects; one rebased is made anew)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE_FILE = ".commit-subject-base"
MAX_SUBJECT = 72


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def new_commits(root: Path) -> list[tuple[str, str]]:
    """(hash, subject) of each commit of `root`'s checkout made after its recorded base;
    skips where there is no history to read. A shallow clone without the base commit
    reads the commits it has from the base's date on."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no commits to read")
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode or Path(top.stdout.strip()).resolve() != root.resolve():
        pytest.skip(f"{root} is not a git checkout's root (an unpacked sdist?): no commits")
    lines = [line for line in (root / BASE_FILE).read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    base, date = lines[0].split()
    if _git(root, "cat-file", "-e", f"{base}^{{commit}}").returncode == 0:
        revisions = f"{base}..HEAD"
    elif _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        revisions = "HEAD"
    else:
        pytest.fail(f"{BASE_FILE}: {base} is not a commit of this repository's history")
    log = _git(root, "log", "--format=%H%x00%s", f"--since={date}", revisions)
    assert log.returncode == 0, log.stderr
    return [(h, s) for h, s in (line.split("\0", 1) for line in log.stdout.splitlines())]


def too_long(commits: list[tuple[str, str]]) -> list[str]:
    return [f"{h[:10]} ({len(s)} characters): {s}" for h, s in commits if len(s) > MAX_SUBJECT]


def test_new_commit_subjects_are_at_most_72_characters() -> None:
    long = too_long(new_commits(ROOT))
    assert not long, (f"subjects of at most {MAX_SUBJECT} characters, the detail in the "
                      "body (git commit --amend, or git rebase -i to reword):\n"
                      + "\n".join(long))


# The check on a repository of its own: a base with a long subject, then new commits.
ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
       "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}


def _commit(repo: Path, message: str, date: str) -> str:
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", message],
                   check=True, env=env)
    return _git(repo, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose base commit's subject is long (made before the rule)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env={**os.environ, **ENV})
    _commit(repo, "an old subject " + "x" * 80, "2026-01-01T00:00:00+00:00")
    base = _commit(repo, "the base, itself long " + "y" * 80, "2026-01-02T00:00:00+00:00")
    (repo / BASE_FILE).write_text(f"# the base\n{base} 2026-01-02T00:00:00+00:00\n")
    return repo


def test_only_commits_after_the_base_are_read(repo: Path) -> None:
    assert new_commits(repo) == []
    short = _commit(repo, "A short subject", "2026-01-03T00:00:00+00:00")
    long = _commit(repo, "z" * 73, "2026-01-04T00:00:00+00:00")
    commits = new_commits(repo)
    assert commits == [(long, "z" * 73), (short, "A short subject")]
    assert too_long(commits) == [f"{long[:10]} (73 characters): {'z' * 73}"]


def test_a_wrapped_first_paragraph_is_one_long_subject(repo: Path) -> None:
    """git joins the first paragraph's lines into the subject --oneline shows."""
    _commit(repo, "A first line of forty characters or so\nand a second one without a "
            "blank line before it", "2026-01-03T00:00:00+00:00")
    assert len(too_long(new_commits(repo))) == 1


def _merge_an_old_branch(repo: Path) -> None:
    """A branch made before the base (its subject long) merged after it, beside a new
    commit: the merge is read, the old branch's commit is not."""
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": "2026-01-05T00:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-01-05T00:00:00+00:00"}
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD").stdout.strip()
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-b", "old", first], check=True)
    _commit(repo, "an old branch's subject " + "v" * 80, "2026-01-01T12:00:00+00:00")
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-"], check=True)
    _commit(repo, "Short again", "2026-01-04T00:00:00+00:00")
    subprocess.run(["git", "-C", str(repo), "merge", "-q", "--no-ff", "-m", "Merge old",
                    "old"], check=True, env=env)


def test_an_old_branch_merged_since_keeps_its_subjects(repo: Path) -> None:
    _merge_an_old_branch(repo)
    assert [s for _, s in new_commits(repo)] == ["Merge old", "Short again"]


def test_a_shallow_clone_reads_from_the_bases_date(repo: Path, tmp_path: Path) -> None:
    _merge_an_old_branch(repo)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "2", f"file://{repo}", str(clone)],
                   check=True, env={**os.environ, **ENV})
    assert _git(clone, "cat-file", "-e", f"{_git(repo, 'rev-parse', 'HEAD~2').stdout.strip()}"
                "^{commit}").returncode != 0  # the base is not in the clone
    (clone / BASE_FILE).write_text((repo / BASE_FILE).read_text())
    assert [s for _, s in new_commits(clone)] == ["Merge old", "Short again"]


def test_a_base_not_in_the_history_is_an_error(repo: Path) -> None:
    (repo / BASE_FILE).write_text("0" * 40 + " 2026-01-02T00:00:00+00:00\n")
    with pytest.raises(pytest.fail.Exception, match="is not a commit"):
        new_commits(repo)


def test_outside_a_checkout_it_skips(tmp_path: Path) -> None:
    (tmp_path / BASE_FILE).write_text("0" * 40 + " 2026-01-02T00:00:00+00:00\n")
    with pytest.raises(pytest.skip.Exception, match="not a git checkout"):
        new_commits(tmp_path)
