"""Result files of the Python tools (memory_snapshot.py, torch_side_by_side.py) written as
stratbench's own are (harness/out_file.h): never a file the tool reads, never a run's results or
lock, never a folder, FIFO or device, and replaced by a rename, so that a hard or symbolic link at
the name is replaced rather than written through (a hard link to results.csv lost the run). And
text printed or written from user input shown, not acted on: what a terminal acts on (ESC, BEL,
C1 controls, text-direction marks) as escapes, as stratbench prints it (cli/terminal_safe.h)."""

import os
import re
import stat
import tempfile

RUN_FILES = ("results.csv", "results.json", "results.partial.csv", "results.partial.json",
             ".stratbench.lock")

_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown(text):
    """`text` with every character a terminal would act on written as an escape (\\u001b), and a
    lone surrogate (JSON's "\\udcff", which no UTF-8 writer takes) as its escape too."""
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return _HIDDEN.sub(lambda m: "\\u%04x" % ord(m.group()), text)


class _Shown:
    """A text stream whose every write goes through shown()."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(shown(text))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install_shown_output():
    """Every line the tool prints shows what a terminal would act on as an escape (an operator
    name or a path quoted from the input), as stratbench's own lines do."""
    import sys
    if not isinstance(sys.stdout, _Shown):
        sys.stdout = _Shown(sys.stdout)
        sys.stderr = _Shown(sys.stderr)


MAX_INPUT_BYTES = 1 << 30


def input_problem(path):
    """Why `path` cannot be read as an input file, or None: a FIFO blocked the reader forever,
    /dev/zero was read until memory ran out, a folder or a missing file was a traceback."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror.lower() if e.strerror else str(e)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a folder, a FIFO or a device); give the file itself"
    if st.st_size > MAX_INPUT_BYTES:
        return f"{st.st_size} bytes, more than the {MAX_INPUT_BYTES} this tool reads"
    return None


def result_path_problem(out, reads):
    """Why `out` may not receive a result file, or None. `reads`: (option, path) the tool reads."""
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return e.strerror
    if st is not None and not stat.S_ISREG(st.st_mode):
        return "not a regular file (a folder, a FIFO or a device); give a file's path"
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        return f"its folder {parent} is not a folder that exists"
    for what, path in reads:
        if st is not None and os.path.exists(path) and os.path.samefile(out, path):
            return f"is the file {what} names: the result would replace what it reads"
    for name in (os.path.basename(out), os.path.basename(os.path.realpath(out))):
        if name in RUN_FILES:
            return f"is named as a run's {name}: replacing it would lose that run; give another path"
    # Another name of the same file (a hard link to a run's results.csv) is fine: replace_file
    # renames over the name, and the other name keeps its bytes.
    return None


def replace_file(out, data):
    """Writes `data` (bytes) beside `out` and renames it over `out`."""
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
