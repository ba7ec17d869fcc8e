"""The agent: the CLSTM actor-critic, its observation windows and window-LSTM kernels, and running a policy
through a split. Imports only `clstm_ppo.config`, `clstm_ppo.market` and `envs`."""
