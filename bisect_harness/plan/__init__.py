"""From a spec to frozen boot recipes: configs, the dry run, the flag check against each
commit's --help, the cache of checkouts."""
