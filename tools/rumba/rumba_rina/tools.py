"""Storyboard command lines written for rlite's tools, as rinad's tools'.

Rumba storyboards start servers and clients by command line
(``Server("rinaperf", options="-l")``, ``Client("rinaperf",
options="-t perf -s 1000 -c 100")``). :func:`translate_command` turns the
rlite tools' options into rina-perf's and rina-echo's; command lines of
any other program pass unchanged (rinad's own tools can be named
directly). ``socket`` adds ``--socket`` so that several nodes can share a
host (each with its own rinad).
"""

import shlex

# rinaperf option -> (takes a value, rina-perf option or None to drop)
_RINAPERF = {
    "-t": (True, "--test"),
    "-s": (True, "--size"),
    "-c": (True, "--count"),
    "-d": (True, "--dif"),
    "-z": (True, "--dst"),
    "-a": (True, "--name"),
    "-p": (True, "--parallel"),
    "-D": (True, "--duration-s"),
    "-g": (True, "--max-sdu-gap"),
    "-i": (True, None),  # inter-SDU interval: rina-perf sends as fast as allowed
    "-v": (False, None),
    "-w": (False, None),
}


class TranslateError(Exception):
    """A command line uses an option the translation does not know."""


def _rinaperf(args):
    listen = "-l" in args
    out = ["rina-perf", "server" if listen else "client"]
    it = iter(a for a in args if a != "-l")
    for a in it:
        if a not in _RINAPERF:
            raise TranslateError("rinaperf option %s has no rina-perf counterpart" % a)
        takes, ours = _RINAPERF[a]
        value = next(it, None) if takes else None
        if takes and value is None:
            raise TranslateError("rinaperf option %s needs a value" % a)
        if ours is None:
            continue
        if listen and ours == "--dst":
            ours = "--name"  # the server registers the name clients ask for
        if listen and ours not in ("--name", "--dif"):
            continue
        if ours == "--test" and value == "ping":
            value = "rr"
        out += [ours, value]
    return out


def _rina_echo(args):
    listen = "-l" in args
    out = ["rina-echo", "server" if listen else "client"]
    it = iter(a for a in args if a != "-l")
    names = {"-d": "--dif", "-z": "--dst", "-a": "--name", "-c": "--count"}
    for a in it:
        if a not in names:
            raise TranslateError("rina-echo-async option %s has no rina-echo counterpart" % a)
        ours, value = names[a], next(it, None)
        if value is None:
            raise TranslateError("rina-echo-async option %s needs a value" % a)
        if listen and ours == "--dst":
            ours = "--name"
        if listen and ours == "--count":
            continue
        out += [ours, value]
    return out


def translate_command(cmd, socket=None):
    """``cmd`` (a shell command line) for rinad's tools; ``socket`` is the
    node's rinad control socket, or None for the default."""
    words = shlex.split(cmd)
    if not words:
        return cmd
    prog = words[0].rsplit("/", 1)[-1]
    if prog == "rinaperf":
        words = _rinaperf(words[1:])
    elif prog == "rina-echo-async":
        words = _rina_echo(words[1:])
    elif prog not in ("rina-perf", "rina-echo", "rina-tgen", "rina-ip", "rinactl"):
        return cmd
    if socket is not None and "--socket" not in words:
        # After the subcommand, where every tool takes it.
        sub = len(words) > 1 and not words[1].startswith("-")
        at = 2 if words[0] in ("rina-perf", "rina-echo", "rina-tgen") and sub else 1
        words[at:at] = ["--socket", socket]
    return " ".join(shlex.quote(w) for w in words)
