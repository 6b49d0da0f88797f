"""Tools: the command line's commands, bench, demo, inspect, describe."""
