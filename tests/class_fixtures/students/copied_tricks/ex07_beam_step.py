"""Dynamic: a module's __dict__."""
import generate

beam_step = generate.__dict__["beam" + "_search"]
gnmt_penalty = generate.__dict__["gnmt_penalty"]
