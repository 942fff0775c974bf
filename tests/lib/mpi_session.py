"""mpirun's session directory, one per test process.

Open MPI 4 keeps a job's session files under <tmpdir>/ompi.<host>.<uid>/,
which the last job to end removes. Two tests running mpirun at once (meson
runs two at a time) can race on that directory: "A call to mkdir was unable
to create the desired directory: /tmp/ompi.vm.0 ... File exists", then
orte_init fails and the run exits 1 before any rank starts. Seen once, under
heavy load from other processes' mpirun. Each test process that calls
private() gets its own base (OMPI_MCA_orte_tmpdir_base), removed at exit;
one already set by the caller is kept.
"""
import atexit
import os
import shutil
import tempfile

VAR = "OMPI_MCA_orte_tmpdir_base"


def private():
    if os.environ.get(VAR):
        return
    base = tempfile.mkdtemp(prefix="spindle-ompi-")
    os.environ[VAR] = base
    atexit.register(shutil.rmtree, base, True)
