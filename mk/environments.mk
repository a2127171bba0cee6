# generated from the environments' registrations (agent_envs.envs.registry) by `agent-envs envs --write-deploy`: do not edit
# The environments that read a directory of prepared data (their registration's data_setting): served, they need `make data` first.
PREPARED_DATA_ENVS := webshop
