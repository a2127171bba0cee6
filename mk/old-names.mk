# The settings' old names (WEBSHOP_*), kept for one release: the service and the trainer serve and train every
# environment, so their settings are AGENTRL_* now (services/env/src/agent_envs/setting_aliases.py has the rule;
# WebShop's own settings keep their names). Included first by the Makefile.
# - set in the shell or on make's command line: sets the new name where that is not set, and leaves the recipes'
#   environment (they see one name only), with one deprecation line;
# - in .env: compose falls back to it (compose.yaml: ${AGENTRL_X:-${WEBSHOP_X:-default}}); named here too.
WEBSHOP_OWN := WEBSHOP_CATALOG WEBSHOP_DEFAULT_GOAL_SET WEBSHOP_COMPAT_GOAL_SET WEBSHOP_MAX_STEPS WEBSHOP_MAX_BATCH \
  WEBSHOP_SHOW_ATTRS WEBSHOP_SHIM_CATALOG WEBSHOP_NUMBA_CACHE_SEED WEBSHOP_BENCH_CACHE WEBSHOP_LUCENE_LARGE_RAW \
  WEBSHOP_LUCENE_LARGE_CATALOG WEBSHOP_LUCENE_LARGE_QUERIES
OLD_SETTINGS := $(sort $(foreach name,$(filter-out $(WEBSHOP_OWN),$(filter WEBSHOP_%,$(.VARIABLES))),\
  $(if $(filter environment command% override,$(origin $(name))),$(name))))
$(foreach old,$(OLD_SETTINGS),\
  $(if $(filter undefined,$(origin AGENTRL_$(old:WEBSHOP_%=%))),$(eval export AGENTRL_$(old:WEBSHOP_%=%) := $$($(old))))\
  $(eval unexport $(old)))
$(if $(OLD_SETTINGS),$(warning deprecated setting names (they go in the next release): \
  $(foreach old,$(OLD_SETTINGS),$(old) -> AGENTRL_$(old:WEBSHOP_%=%))))
OLD_DOTENV_SETTINGS := $(filter-out $(WEBSHOP_OWN),$(shell sed -n 's/^[[:space:]]*\(WEBSHOP_[A-Z0-9_]*\)=.*/\1/p' .env 2>/dev/null))
$(if $(OLD_DOTENV_SETTINGS),$(warning .env sets $(words $(OLD_DOTENV_SETTINGS)) settings by their deprecated names \
  ($(firstword $(OLD_DOTENV_SETTINGS)) ...): compose reads them for one more release; rename WEBSHOP_ to AGENTRL_ \
  (WebShop's own settings keep theirs: docs/configuration.md)))
