"""PLACEHOLDER until the metrics branch merges."""
SCHEMA_VERSION = 1
ECHO, CEILING, SWITCH, ZMQ = "echo", "ceiling", "switch", "zmq"


def stamp(family):
    return {"pcb_family": family, "pcb_schema": SCHEMA_VERSION}
