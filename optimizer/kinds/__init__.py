"""Segment kinds and the rules that say what one kernel of each kind may hold: what the planner
enforces and the code generator relies on."""
