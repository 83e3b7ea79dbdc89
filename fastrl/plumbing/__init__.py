"""What every fastrl process stands on: shared-memory trajectory buffers, parameter
publishing, the stats board, polling a queue, starting and seeding a child process.
It knows the shapes of the data, never what the learner does with it."""
