"""The learning algorithm as pure tensor functions: V-trace, the APPO loss, action
distributions and the actor-critic model. Nothing here starts a process, reads a
queue or knows about shared memory, so every piece is tested alone."""
