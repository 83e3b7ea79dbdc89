"""Consuming experience: the learner process, its checkpoints, the evaluator that
keeps the best policy, and the warnings read from the learner's statistics."""
