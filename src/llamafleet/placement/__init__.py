"""What fits where: the VRAM planner, pure functions of a model header, a GPU inventory and the configuration."""
