"""The ground floor of text2grad: everything the three phases share, importing nothing above it.

- feedback.py: the `Feedback` record and its tolerant parser.
- spans.py: quoted spans -> character intervals -> the policy tokenizer's tokens.
- rewards.py: token rewards (+1 / -1 / 0, decay schemes) and the reward modes built on them.
- ppo_math.py: masked statistics, log-probs, KL, GAE, whitening, the clipped losses.
- critics.py: the `FeedbackSource` protocol a critic implements, the one registry of critics, the one
  `module:Name` loader (the only place that imports by name) and `extract_code`.
- config.py, data.py, generation.py, modeling.py: configuration, records, sampling and model loading.
- sandbox: the only place untrusted (model-written) code runs.

A test (tests/test_layering.py) fails if a module here imports `annotation`, `reward_model`,
`policy_optimization` or `text2grad.apps`.
"""
