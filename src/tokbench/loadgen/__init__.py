"""Load generation: wire protocol (protocol), streaming client (client), schedules (schedule), sweeps."""
