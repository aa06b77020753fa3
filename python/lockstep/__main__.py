"""`python -m lockstep ARGS...` runs the lockstep command-line tool installed inside the package
(the same binary the C++ build makes), replacing this process: exit codes, signals (SIGINT removes
half-written outputs), stdin and stdout are the tool's own."""
import os
import sys


def executable() -> str:
    """The lockstep binary: $LOCKSTEP_CLI, else the one beside this package (bin/lockstep)."""
    override = os.environ.get("LOCKSTEP_CLI")
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "lockstep")


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"lockstep: error: the lockstep executable is missing at {exe} "
                         "(reinstall the package, or set LOCKSTEP_CLI)\n")
        sys.exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
