"""The `dlrmkit` command. Each subcommand lives in its own module, which exposes
`add_arguments(parser)` and `run(args) -> int`; this file only wires them together."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import sys

from dlrmkit.errors import describe_error

# name -> (module, one-line help). Adding a command means adding its module and one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("dlrmkit.commands.synth", "write a synthetic dataset drawn from a hidden teacher model"),
    "train": ("dlrmkit.commands.train", "train a DLRM on a FeatureSpec dataset"),
    "multihot": ("dlrmkit.commands.multihot", "expand a one-hot dataset into MLPerf DCNv2's synthetic multi-hot bags"),
    "baseline": (
        "dlrmkit.commands.baseline",
        "fit a logistic regression on the same dataset and splits (what the DLRM must beat)",
    ),
    "evaluate": ("dlrmkit.commands.evaluate", "compute test AUC and log loss of a checkpoint"),
    "bench": ("dlrmkit.commands.bench", "measure training throughput on random in-memory data"),
    "plan": ("dlrmkit.commands.plan", "plan how embedding tables are sharded over ranks"),
    "report": ("dlrmkit.commands.report", "plot a run folder's loss, AUC and throughput and write a Markdown summary"),
    "tune": ("dlrmkit.commands.tune", "search hyperparameters with Optuna (TPE, pruning, resumable SQLite study)"),
    "export": ("dlrmkit.commands.export", "write a checkpoint's model as one file for serving (pt, torchscript, onnx)"),
    "predict": (
        "dlrmkit.commands.predict",
        "score raw rows (Criteo TSV or the transcoded CSV) with a checkpoint; writes click probabilities",
    ),
    "preprocess": ("dlrmkit.commands.preprocess", "turn raw Criteo click logs into a FeatureSpec dataset"),
    "transcode": (
        "dlrmkit.commands.transcode",
        "turn any CSV/TSV/Parquet with named columns into a FeatureSpec dataset",
    ),
    "validate": ("dlrmkit.commands.validate", "check a dataset against its FeatureSpec and summarize it"),
}


def printable(text: str) -> str:
    """`text` on one line: a control character (a line break in a value) or an undecodable
    byte is written as its escape, so an error message stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class StoreOnce(argparse._StoreAction):
    """argparse's `store`, except that an option given twice is an error instead of the last
    value silently winning (`--input a --input b` would drop `a`)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        seen = getattr(parser, "_given", None)
        if seen is not None:
            if self.dest in seen:
                parser.error(f"argument {'/'.join(self.option_strings)}: given more than once; give it once")
            seen.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the option (exit 2), like every other
    error, an option that takes a value may be given only once, and an option must be spelled
    out (no abbreviations: `--max-step` is not silently `--max-steps`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given: set[str] = set()
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Unknown arguments are reported by the subcommand they were given to, with the
        closest option it has."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self._chosen(ns)
            target.error(f"unrecognized arguments: {' '.join(extras)}{target.suggestion(extras)}")
        return ns

    def _chosen(self, ns: argparse.Namespace) -> OneLineParser:
        """The subcommand's parser named in ns, else this one."""
        for action in self._subparsers._group_actions if self._subparsers else ():
            chosen = getattr(action, "choices", None) or {}
            if getattr(ns, action.dest or "", None) in chosen:
                return chosen[getattr(ns, action.dest)]
        return self

    def suggestion(self, extras: list[str]) -> str:
        """'; did you mean --rows?' for the first unknown option close to a known one, else ''."""
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for word in extras:
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.7)
                if close:
                    return f"; did you mean {close[0]}?"
        return ""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message)} (see `{self.prog} --help`)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; given the command line, only the chosen command's module is imported
    (the others would pull torch into `dlrmkit preprocess`: a second of start-up)."""
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    parser = OneLineParser(
        prog="dlrmkit",
        description="Train DLRM recommendation models, from one process to hybrid-parallel torchrun jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Large tensors on transparent huge pages: first-touch page faults of fresh per-step buffers
    # cost ~3x less (docs/BENCHMARKS.md). Must be set before torch allocates; users may override.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    from dlrmkit.allocator import keep_freed_memory

    keep_freed_memory()  # each step's buffers reuse freed pages instead of faulting in fresh ones
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_in)
    args = parser.parse_args(args_in)
    args._argv = args_in  # `train --config` re-parses with YAML defaults
    try:
        from dlrmkit.faults import check_environment

        check_environment()  # a malformed DLRMKIT_FAULT is one line before any work
        from dlrmkit.parallel.options import refuse_one_process_command_under_torchrun

        refuse_one_process_command_under_torchrun(args.command)
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a reader gone before the last buffered line is seen here, not at exit
        return code
    except KeyboardInterrupt as exc:
        print(f"dlrmkit {args.command}: interrupted{getattr(exc, 'detail', '')}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every error leaves as one line
        if isinstance(exc, BrokenPipeError) and stdout_closed():
            return quiet_broken_pipe()
        message, code = describe_error(exc)
        if code == 1 and os.environ.get("DLRMKIT_DEBUG"):
            raise
        line = f"dlrmkit {args.command}: error: {message}"
        print(line, file=sys.stderr)
        tell_torchrun(line)
        return code
    finally:
        from dlrmkit.atomic_io import release_output_locks

        release_output_locks()  # locks a command held on its outputs (dlrmkit.atomic_io.output_lock)


SIGPIPE_EXIT = 141  # what a shell reports for a program killed by SIGPIPE (128 + 13), as `cat` is


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll says POLLERR), i.e. the
    BrokenPipeError came from our output and not from some other pipe or socket."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # output is no OS file, so the broken pipe is another one
    if not hasattr(select, "poll"):
        return True  # cannot tell: a broken pipe is most likely the output's
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def quiet_broken_pipe() -> int:
    """The reader of our output stopped early (`dlrmkit plan ... | head -1`): not an error, so no
    message; stdout goes to /dev/null so the flush at exit cannot fail again (the recipe of
    Python's signal docs). The exit status is the conventional SIGPIPE one, as other tools give."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return SIGPIPE_EXIT


def tell_torchrun(line: str) -> None:
    """Under torchrun, the rank's one-line error also goes into the error file torchrun's agent
    reads (TORCHELASTIC_ERROR_FILE, in the format torch.distributed.elastic's ErrorHandler writes),
    so the failure summary torchrun prints after its own traceback names the error, not a link to
    its docs. Created only, never written over: an existing file at that path stays as it is.

    The file appears whole or not at all: it is written beside the path and then linked to it.
    When one rank fails, torchrun SIGTERMs the others and then reads each one's error file; a rank
    stopped halfway through writing would otherwise leave an empty file, which the agent cannot
    parse, and the agent itself would then fail instead of restarting the worker group."""
    from dlrmkit.parallel.options import launched_by_torchrun

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not launched_by_torchrun():
        return
    import json
    import time

    record = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    draft = f"{path}.{os.getpid()}.draft"
    try:
        with open(draft, "x", encoding="utf-8") as f:
            json.dump(record, f)
        os.link(draft, path)  # fails, leaving the existing file, when one is there
    except OSError:
        pass  # the line on stderr is the message; the summary then shows torchrun's default
    finally:
        with contextlib.suppress(OSError):
            os.unlink(draft)


def entry() -> None:
    """Console-script and `python -m` entry. Under torchrun, once the command has flushed its
    output and left the process group, the process ends with os._exit: C++ destructors of
    collective-library threads during interpreter teardown can abort a finished rank
    ('terminate called without an active exception', seen once on CI), and torchrun would
    then report a successful job as failed."""
    code = main()
    from dlrmkit.parallel.options import launched_by_torchrun

    if launched_by_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
