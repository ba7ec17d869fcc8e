"""Training: rollouts, the PPO update, one rank's loop, process groups and their launch, the run folder
(checkpoints, logs). Imports the agent and below, never evaluation or the command line."""
