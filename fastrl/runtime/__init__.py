"""Running a training job: the runner that builds the shared state, starts, watches
and stops every process, worker supervision, the sink that stands in for the learner
when only sampling is measured, and where metrics are written."""
