"""``rlattention <fit|eval|viz|data|bench|backbones> ...``: the one entry point.

One module per command (:mod:`.fit`, :mod:`.evaluate`, :mod:`.viz`, :mod:`.data`, :mod:`.bench`,
:mod:`.backbones`), each with its ``command(args)``; :mod:`.parser` holds the command line; here, :func:`main`
runs a command and turns its errors and stop signals into one line and an exit code.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from rlattention.cli import backbones, bench, data, evaluate, fit, viz
from rlattention.cli.backbones import backbone_rows
from rlattention.cli.parser import build_parser
from rlattention.cli.viz import NoFigures

__all__ = ["backbone_rows", "build_parser", "main"]


class _StopOutsideTraining(BaseException):
    """SIGTERM or SIGHUP while no training loop runs (data building, evaluation, figures): ends the command with
    one line. (While ``fit`` trains, its own handlers take these signals and save a resumable checkpoint.)"""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, frame) -> None:
    raise _StopOutsideTraining(signum)


@contextlib.contextmanager
def _stop_signals_end_cleanly():
    """SIGTERM and SIGHUP raise :class:`_StopOutsideTraining` instead of killing the process (SIGINT already raises
    ``KeyboardInterrupt``): from the main thread only, never over an ignored signal (``nohup``) or a handler not set
    from Python; the previous handlers are put back on exit."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handler = signal.getsignal(sig)
            if handler == signal.SIG_DFL:
                previous[sig] = handler
                signal.signal(sig, _raise_stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    with _stop_signals_end_cleanly():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, as eval.json records it
    # key=value overrides may follow options (argparse stops filling a positional list at the first option)
    target = {"fit": "overrides", "eval": "overrides", "data": "rest"}.get(args.command)
    if unknown and (target is None or any(u.startswith("-") or "=" not in u for u in unknown)):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        setattr(args, target, [*getattr(args, target), *unknown])
    from rlattention.data.registry import _import_all  # noqa: F401  (register datasets early)
    from rlattention.engine.checkpoint import CheckpointError
    from rlattention.engine.config import ConfigError
    from rlattention.engine.distributed import CollectiveTimeout, leave_after_collective_failure, leave_process_group
    from rlattention.engine.signals import TrainingInterrupted
    from rlattention.engine.trainer import TrainingDiverged

    handlers = {
        "fit": fit.command,
        "eval": evaluate.command,
        "viz": viz.command,
        "data": data.command,
        "bench": bench.command,
        "backbones": backbones.command,
    }
    try:
        if getattr(args, "imports", None):
            from rlattention.plugins import import_plugins

            import_plugins(args.imports, "--import")
        code = handlers[args.command](args)
        leave_process_group(exit_code=code)  # several processes: every rank ends here, in order (no teardown)
        return code
    except (ConfigError, CheckpointError, FileNotFoundError, KeyError, ValueError, OSError, ModuleNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"rlattention {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except NoFigures as e:
        print(f"rlattention {args.command}: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:  # a non-finite loss: the message names the step and the term
        print(f"rlattention {args.command}: stopped: {e}", file=sys.stderr)
        return 3
    except TrainingInterrupted as e:  # SIGTERM, SIGHUP, SIGINT: last.ckpt saved; the message names how to continue
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        if rank_zero_only.rank == 0:  # every rank stopped at the same step: one line
            print(f"rlattention {args.command}: {e}", file=sys.stderr)
        leave_process_group(exit_code=e.exit_code)  # several processes: every rank ends here, in order
        return e.exit_code  # 128 + the signal's number, as a shell reports a process ended by it
    except CollectiveTimeout as e:  # a rank stalled or died: one line from each rank that noticed, naming it
        print(f"rlattention {args.command}: error: {e}", file=sys.stderr)
        leave_after_collective_failure(e.exit_code)  # several processes: ends here, without meeting the others
        return e.exit_code
    except (_StopOutsideTraining, KeyboardInterrupt) as e:  # outside a training loop: nothing half-written to keep
        signum = e.signum if isinstance(e, _StopOutsideTraining) else int(signal.SIGINT)
        resume = "; a run with checkpoints/last.ckpt continues with: rlattention fit --resume RUN"
        hint = resume if args.command == "fit" else ""
        print(
            f"rlattention {args.command}: interrupted by {signal.Signals(signum).name} outside the training loop "
            f"(no checkpoint written by this stop){hint}",
            file=sys.stderr,
        )
        return 128 + signum
