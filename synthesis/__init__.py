"""EnvScaler-style synthesis (SkelBuilder, ScenGenerator) as an API client. Not built yet: see issue 6."""
