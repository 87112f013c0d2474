"""Reading torch's Flight Recorder dumps for the progress reporter: a dump's statuses alone, the
step a rank's entries repeat, and a collective's size."""

import json

# The longest step period looked for: collectives a loop issues per step.
MAX_COLLECTIVES_PER_STEP = 32
# Bytes per element of the Flight Recorder's dtype names; an unknown one counts 4.
DTYPE_BYTES = {"Double": 8, "Long": 8, "ComplexFloat": 8, "ComplexDouble": 16, "Float": 4,
               "Int": 4, "Half": 2, "BFloat16": 2, "Short": 2, "Byte": 1, "Char": 1, "Bool": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def step_of(entries):
    """(step ns, period) from {seq: (created ns, elements, ...)}: the smallest period P at which
    the collectives' sizes repeat (DDP's buckets, then what the loop adds), and the median time
    from one to the same one P later; (0, 0) when no period shows."""
    for period in range(1, MAX_COLLECTIVES_PER_STEP + 1):
        pairs = [(entries[seq], entries[seq + period]) for seq in entries if seq + period in entries]
        steps = sorted(later[0] - first[0] for first, later in pairs if first[1] == later[1])
        if len(pairs) >= 5 and len(steps) >= 0.75 * len(pairs):
            return steps[len(steps) // 2], period
    return 0, 0


def element_count(sizes):
    """The elements of a collective's inputs, from the Flight Recorder's input_sizes."""
    total = 0
    for shape in sizes or []:
        count = 1
        for dimension in shape:
            count *= dimension
        total += count
    return total


def pg_status(dump):
    """The "pg_status" object of a Flight Recorder JSON dump, parsed alone: the dump's pg_config
    lists every group's ranks, which a 16K-rank job makes a hundred kilobytes."""
    dump = dump.decode() if isinstance(dump, bytes) else dump  # torch returns bytes.
    at = dump.find('"pg_status"')
    if at < 0:
        return json.loads(dump).get("pg_status", {})
    return json.JSONDecoder().raw_decode(dump, dump.index("{", at))[0]


def collective_bytes(entry):
    """What nccl-tests calls a collective's size: the larger of its inputs and outputs in bytes
    (all-gather's whole output, reduce-scatter's whole input)."""
    def total(sizes, dtypes):
        return sum(element_count([shape]) * DTYPE_BYTES.get(dtype, 4)
                   for shape, dtype in zip(sizes or [], dtypes or []))
    return max(total(entry.get("input_sizes"), entry.get("input_dtypes")),
               total(entry.get("output_sizes"), entry.get("output_dtypes")))
