"""feedbench scan: how fast N consumers can iterate the data, stage by stage."""
