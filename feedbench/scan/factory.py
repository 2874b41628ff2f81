"""The user's own loader (``--loader FILE.py:FUNCTION`` or ``--loader MODULE:FUNCTION``): the
spec resolved to its factory, the keywords the factory is called with, ``--loader-option``
values, and errors in the user's code shown with the user's frames only.

A factory is called in every consumer with the keywords it accepts among :data:`STANDARD`
(``**kwargs`` takes them all), plus the loader options, and returns any iterable of batches.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from feedbench.core.errors import FeedbenchError

BUILTIN = ("torch", "dali", "wds", "auto")
# the keywords feedbench offers every factory (it takes those its signature names)
STANDARD = ("rank", "world_size", "local_rank", "batch_size", "workers", "seed", "epoch", "path")
_SPEC_HELP = "choose torch, dali or wds, or give FILE.py:FUNCTION or MODULE:FUNCTION"


class UserLoaderError(FeedbenchError):
    """A problem with the user's loader (its spec, its code, its batches). Raised in a consumer,
    it reaches the parent whole (exit 2), not as a consumer that failed."""


class UserCodeError(UserLoaderError):
    """The user's code raised; ``details`` holds its traceback, the user's frames only."""


def is_user_spec(loader: str | None) -> bool:
    return loader is not None and loader not in BUILTIN


@dataclass(frozen=True)
class Factory:
    """A resolved factory: the function, the file that defines it, and what it accepts."""

    spec: str
    function: Callable[..., Any]
    file: str  # absolute
    root: str  # the user's code: frames in this file, or under this package folder
    params: tuple[str, ...]  # names it takes by keyword
    required: tuple[str, ...]  # of those, the ones without a default
    accepts_all: bool  # a **kwargs parameter

    def describe(self) -> dict[str, str]:
        """What the results record: the spec, the file and a hash of it, the function."""
        with open(self.file, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        name = self.spec.rpartition(":")[2]
        return {"spec": self.spec, "file": self.file, "function": name, "sha256": digest}


def split_spec(spec: str) -> tuple[str, str, bool]:
    """``"a/b.py:make"`` → ("a/b.py", "make", True); ``"pkg.mod:make"`` → (…, False)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise FeedbenchError(f"unknown loader {spec!r}: {_SPEC_HELP}")
    is_file = where.endswith(".py") or "/" in where or os.sep in where
    return where, name, is_file


def resolve(spec: str) -> Factory:
    """The factory ``spec`` names, its file or module imported (once per process)."""
    where, name, is_file = split_spec(spec)
    if is_file:
        module, root = _load_file(spec, where), os.path.abspath(where)
    else:
        root = _package_root(spec, where)
        module = _import(spec, where, root)
    fn: Any = module
    for part in name.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UserLoaderError(f"--loader {spec}: no {name!r} in {where}")
    if not callable(fn):
        raise UserLoaderError(f"--loader {spec}: {name} is a {type(fn).__name__}, not a function")
    return _signature(spec, fn, os.path.abspath(getattr(module, "__file__", None) or root), root)


def _signature(spec: str, fn: Callable[..., Any], file: str, root: str) -> Factory:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: offer nothing
        params = []  # type: ignore[assignment]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [p for p in params if p.kind in kinds]
    stuck = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY
             and p.default is inspect.Parameter.empty]  # fmt: skip
    if stuck:
        raise UserLoaderError(
            f"--loader {spec}: feedbench calls the factory with keywords; {stuck[0]!r} is "
            "positional-only"
        )
    return Factory(
        spec=spec,
        function=fn,
        file=file,
        root=root,
        params=tuple(p.name for p in named),
        required=tuple(p.name for p in named if p.default is inspect.Parameter.empty),
        accepts_all=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
    )


def _load_file(spec: str, where: str):
    """The module of a ``.py`` file, named after the file (so that spawned loader workers can
    import it again), its folder first on ``sys.path`` as for a script; reused when already
    imported (a script that calls :func:`feedbench.measure` on its own function)."""
    full = os.path.abspath(where)
    if not os.path.isfile(full):
        raise UserLoaderError(f"--loader {spec}: no such file: {where}")
    for mod in list(sys.modules.values()):
        if os.path.abspath(getattr(mod, "__file__", None) or "/") == full:
            return mod
    stem = os.path.splitext(os.path.basename(full))[0]
    if not stem.isidentifier() or stem in sys.modules:  # a name every process gives it alike
        stem = "_feedbench_loader_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    name = stem
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    found = importlib.util.spec_from_file_location(name, full)
    if found is None or found.loader is None:
        raise UserLoaderError(f"--loader {spec}: cannot import {where}")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    try:
        found.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise user_error(e, full, f"importing {where}") from None
    return module


def _package_root(spec: str, where: str) -> str:
    """The user's code for a module spec: its top-level package's folder (or the module file)."""
    if os.getcwd() not in sys.path:  # as `python -m` would: the working directory's packages
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(where.split(".")[0])
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UserLoaderError(f"--loader {spec}: no module named {where.split('.')[0]!r}")
    if found.submodule_search_locations:
        return os.path.abspath(list(found.submodule_search_locations)[0])
    return os.path.abspath(found.origin or where)


def _import(spec: str, where: str, root: str):
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        if e.name and where.startswith(e.name):
            raise UserLoaderError(f"--loader {spec}: no module named {e.name!r}") from None
        raise user_error(e, root, f"importing {where}") from None
    except Exception as e:
        raise user_error(e, root, f"importing {where}") from None


def user_error(e: BaseException, root: str, what: str) -> UserCodeError:
    """``e`` raised by the user's code as one line naming ``what``, its traceback in
    ``details`` trimmed to the frames in ``root`` (a file, or a package folder)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _within(f.filename, root)]
    lines = ["Traceback (your code, most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(e), e)
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    error = UserCodeError(f"{what} raised {type(e).__name__}" + (f": {first}" if first else ""))
    error.details = "".join(lines).rstrip()
    if hasattr(error, "add_note"):  # Python ≥ 3.11: a notebook's traceback shows them too
        error.add_note(error.details)
    return error


def _within(filename: str, root: str) -> bool:
    path = os.path.abspath(filename)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def parse_value(raw: str) -> Any:
    """A ``--loader-option`` value: int, float, bool (true/false), else the string."""
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw


def parse_options(items: Iterable[str]) -> dict[str, Any]:
    """``["shuffle=true", "size=160"]`` → ``{"shuffle": True, "size": 160}``."""
    options: dict[str, Any] = {}
    for text in items:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise FeedbenchError(f"--loader-option {text!r}: give KEY=VALUE")
        if key in options:
            raise FeedbenchError(f"--loader-option {key} given twice")
        options[key] = parse_value(raw)
    return options


def check_options(f: Factory, options: dict[str, Any]) -> None:
    """One clear error for an option the factory cannot take or a keyword it needs and lacks."""
    name = f.spec.rpartition(":")[2]
    reserved = [k for k in options if k in STANDARD]
    if reserved:
        raise FeedbenchError(
            f"--loader-option {reserved[0]}: feedbench passes {reserved[0]} itself "
            "(set it with the scan's own option)"
        )
    unknown = [k for k in options if not f.accepts_all and k not in f.params]
    if unknown:
        takes = ", ".join(f.params) or "no keywords"
        raise FeedbenchError(f"--loader-option {unknown[0]}: {name} takes {takes}")
    missing = [k for k in f.required if k not in STANDARD and k not in options]
    if missing:
        key = missing[0]
        raise FeedbenchError(f"{name} needs {key!r}: pass --loader-option {key}=VALUE")


def call_kwargs(f: Factory, standard: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of one call: the standard ones the factory accepts, then the options."""
    return {k: v for k, v in standard.items() if f.accepts_all or k in f.params} | options


def make(f: Factory, kwargs: dict[str, Any]) -> Iterable[Any]:
    """Call the factory; its exception is the user's (their frames), a result that is not an
    iterable of batches one clear error."""
    try:
        made = f.function(**kwargs)
    except Exception as e:
        raise user_error(e, f.root, f"the loader factory {f.spec}") from None
    if not (hasattr(made, "__iter__") or hasattr(made, "__getitem__")) or isinstance(
        made, (str, bytes)
    ):
        raise UserLoaderError(
            f"the loader factory {f.spec} returned {type(made).__name__}, not an iterable of "
            "batches (return the DataLoader, dataset or generator itself)"
        )
    return made


def epoch_owner(loader: Any) -> Any:
    """What moves ``loader`` to the next epoch: the first of the loader, its sampler (a
    DataLoader over a DistributedSampler) or its dataset (a Hugging Face IterableDataset) with a
    ``set_epoch``; None when none has one."""
    for owner in (loader, getattr(loader, "sampler", None), getattr(loader, "dataset", None)):
        if callable(getattr(owner, "set_epoch", None)):
            return owner
    return None


def run_exit_handlers(code: int = 0, timeout_s: float = 10.0) -> None:
    """Run the ``atexit`` handlers now, as a training script's end would: a process that used the
    user's loader leaves through ``os._exit`` (see ``leave_without_finalizing``), which skips
    them, and loaders clean up there (MosaicML Streaming unlinks its shared memory). A handler
    still running after ``timeout_s`` (joining a child that never ends) is left: the process
    exits with ``code``, its results already written, rather than hang as a stalled one."""
    guard = threading.Timer(timeout_s, os._exit, (code,))
    guard.daemon = True
    guard.start()
    try:
        atexit._run_exitfuncs()
    finally:
        guard.cancel()
