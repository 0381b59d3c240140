"""What check_flight.py and check_spike.py share: a closed run whose flight
recorder dumped exactly once."""

import tensortap


def the_dump(path):
    """The run at `path`, which must be closed and hold exactly one dump, and that dump."""
    run = tensortap.open(path)
    assert run.closed
    assert len(run.dumps) == 1, run.dumps
    return run, run.dumps[0]
