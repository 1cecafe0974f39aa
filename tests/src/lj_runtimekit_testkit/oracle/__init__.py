"""The differential harness: generated cases run under kube-scheduler and lj-runtimekit-scheduler
on identical state on a real apiserver, compared with each other and with an independent checker
(issue 35 §2). ``python -m lj_runtimekit_testkit.oracle --help``."""
