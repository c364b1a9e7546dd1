"""Planted bugs of the memory side: the radix cache, the KV manager, the scheduler and the KV
tiers (the rest, and what the fields mean: scripts/planted_bugs.py)."""

from __future__ import annotations

from planted_bug import (
    DISK_FORMAT,
    FAIR,
    FOLDING,
    KV,
    KV_TIERS,
    PLANNER,
    POOL,
    PREEMPTION,
    RADIX,
    T_DISK,
    T_KV,
    T_KV_TIERS,
    T_PLANNER,
    T_POOL,
    T_PRIORITIES,
    T_RADIX,
    T_SIM,
    T_TABLE,
    T_TIER_MOVER,
    TIER_MOVER,
    PlantedBug,
)

MEMORY_BUGS: tuple[PlantedBug, ...] = (
    # --- radix cache ---------------------------------------------------------------------------
    PlantedBug(
        "radix-split-drops-lock", "radix cache", RADIX,
        "        upper.lock_count = node.lock_count  # on the path of everything below, none "
        "taken on it\n",
        "        upper.lock_count = 0  # a new node: nothing has locked it yet\n",
        (T_RADIX,),
        "splitting a locked node leaves its upper half unlocked, so eviction can free the KV of "
        "a prefix a running request is reading",
    ),
    PlantedBug(
        "radix-evicts-most-recent", "radix cache", RADIX,
        "            leaf = leaves[0]\n",
        "            leaf = leaves[-1]\n",
        (T_RADIX,),
        "eviction takes the most recently used leaf instead of the least, so the hot system "
        "prompt is recomputed while stale prefixes stay cached",
    ),
    PlantedBug(
        "radix-hit-not-touched", "radix cache", RADIX,
        "                child = self._split(child, n)\n            self._touch(child, now)\n"
        "            if child.tier == DEVICE_TIER:\n",
        "                child = self._split(child, n)\n"
        "            if child.tier == DEVICE_TIER:\n",
        (T_RADIX,),
        "a cache hit does not refresh the prefix's LRU position, so the prefix every request "
        "shares is evicted as if it were never used",
    ),
    PlantedBug(
        "radix-existing-len-short", "radix cache", RADIX,
        "            elif child.tier == tier:\n                existing_len = pos + n\n",
        "            elif child.tier == tier:\n                existing_len = pos\n",
        (T_RADIX,),
        "an insert under-reports how much of the key was already cached, so a prefix computed "
        "twice at once is never de-duplicated and holds twice the KV",
    ),
    PlantedBug(
        "radix-salt-falls-back-to-shared", "radix cache", RADIX,
        "        key = tuple(key[: len(key) // p * p])\n"
        "        node = self._roots.get(extra_key)\n",
        "        key = tuple(key[: len(key) // p * p])\n"
        "        node = self._roots.get(extra_key) or self._roots.get(None)\n",
        (T_RADIX,),
        "a request with a cache_salt whose namespace is empty matches the shared namespace, so "
        "it reuses (and can time) KV computed for other tenants",
    ),
    PlantedBug(
        "radix-unlock-loses-evictable-count", "radix cache", RADIX,
        "                self._locked_pages -= len(walk.pages)\n"
        "                self._evictable_pages += len(walk.pages)\n"
        "                if not walk.tier_children:\n"
        "                    self._leaves[DEVICE_TIER].add(walk)\n",
        "                self._locked_pages -= len(walk.pages)\n"
        "                if not walk.tier_children:\n"
        "                    self._leaves[DEVICE_TIER].add(walk)\n",
        (T_RADIX,),
        "unlocked pages are not counted as evictable, so the scheduler believes the pool is "
        "full and stalls or preempts while cached KV could be freed",
    ),
    # --- KV manager ----------------------------------------------------------------------------
    PlantedBug(
        "kv-page-count-floor", "KV manager", KV,
        "        return -(-num_positions // self.page_size)\n",
        "        return num_positions // self.page_size\n",
        (T_KV,),
        "the page count of a partly filled last page rounds down, so a request's last tokens "
        "get no page and write into another request's KV",
    ),
    PlantedBug(
        "kv-cow-skipped-for-tree-shared-page", "KV manager", KV,
        "        cow = filled and self.pool.refcount(req.pages[-1]) > 1\n",
        "        cow = filled and self.pool.refcount(req.pages[-1]) > 2\n",
        (T_KV, T_SIM),
        "a partly filled page shared by a request and the radix tree (or one fork sibling) is "
        "written in place instead of copied, corrupting the other holder's KV",
    ),
    PlantedBug(
        "kv-cow-old-page-not-decrefed", "KV manager", KV,
        "            self.pool.decref([old])\n            req.pages[-1] = new\n",
        "            req.pages[-1] = new\n",
        (T_KV,),
        "copy-on-write never drops the request's reference on the shared page it copied, so "
        "every n > 1 fork leaks a page until the pool runs dry",
    ),
    PlantedBug(
        "kv-lock-kept-on-uncached-release", "KV manager", KV,
        "            self.cache_prefix(req)\n        if req.tree_node is not None:\n",
        "            self.cache_prefix(req)\n        if req.tree_node is not None and cache:\n",
        (T_KV, T_SIM),
        "an aborted or swapped-out request keeps its lock on the radix path, so that prefix can "
        "never be evicted and the pool shrinks with every abort",
    ),
    PlantedBug(
        "kv-whole-prompt-matched", "KV manager", KV,
        "        limit = len(ids) - 1  # the last token is always computed: its logits are "
        "needed\n",
        "        limit = len(ids)\n",
        (T_KV, T_SIM),
        "a prompt that is wholly cached is admitted with nothing left to compute, so there are "
        "no logits to sample its first token from",
    ),
    PlantedBug(
        "pool-double-free-unchecked", "KV manager", POOL,
        "            if refcounts[page] < times:\n",
        "            if refcounts[page] < 1:\n",
        (T_POOL,),
        "a page listed twice in one decref passes the double-free check, its refcount goes "
        "negative and it is handed to two requests at once",
    ),
    # --- scheduler -----------------------------------------------------------------------------
    PlantedBug(
        "sched-swap-out-forgets-last-token", "scheduler", PREEMPTION,
        "            slots = self.kv.slots(victim, 0, victim.kv_len)\n",
        "            slots = self.kv.slots(victim, 0, victim.kv_len - 1)\n",
        (f"{T_SIM}::test_tight_pools_with_swapping_keep_every_invariant", T_PLANNER),
        "a swap preemption copies all but the last position's KV to host memory, so the "
        "request resumes with one token's KV missing and continues wrongly",
    ),
    PlantedBug(
        "sched-prefill-chunk-ignores-budget", "scheduler", PLANNER,
        "                chunk = self._whole(req, min(req.remaining, draft.budget))\n"
        "                self._plan_chunk(req, chunk, draft, self._prompt_draft(req, chunk, "
        "draft))\n",
        "                chunk = self._whole(req, req.remaining)\n"
        "                self._plan_chunk(req, chunk, draft, self._prompt_draft(req, chunk, "
        "draft))\n",
        (T_PLANNER,),
        "a running prefill is planned whole instead of within the step's token budget, so a "
        "long prompt stalls every decode in the batch (no chunked prefill)",
    ),
    PlantedBug(
        "sched-victim-oldest-not-newest", "scheduler", PLANNER,
        "        victim = max(candidates, key=lambda r: (r.priority, r.admitted_at), "
        "default=None)\n",
        "        victim = max(candidates, key=lambda r: (r.priority, -r.admitted_at), "
        "default=None)\n",
        (T_PLANNER, T_SIM),
        "preemption for memory takes the oldest running request instead of the newest, "
        "throwing away the most computed work and starving long requests",
    ),
    PlantedBug(
        "sched-max-running-off-by-one", "scheduler", PLANNER,
        "                    or len(table.running) + reserved >= "
        "self.config.max_running_requests):\n",
        "                    or len(table.running) + reserved > "
        "self.config.max_running_requests):\n",
        (T_PLANNER, T_SIM),
        "admission lets one request more than max_running_requests run",
    ),
    PlantedBug(
        "sched-fair-weight-inverted", "scheduler", FAIR,
        "            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens / "
        "self.weight(tenant)\n",
        "            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens * "
        "self.weight(tenant)\n",
        (T_PRIORITIES, T_TABLE),
        "a tenant's weight slows its clock down instead of up, so a weight-2 tenant gets half "
        "its fair share instead of twice",
    ),
    PlantedBug(
        "sched-shared-pages-counted-per-request", "scheduler", FAIR,
        "        if (before == 0) != (before + change == 0):\n",
        "        if change:\n",
        (f"{T_PRIORITIES}::test_a_prompt_shared_by_a_tenants_requests_counts_once_toward_its_"
         "share", T_PRIORITIES),
        "a tenant's KV share counts a prompt its requests share once per request, so a tenant "
        "using the prefix cache well looks over its share and is preempted",
    ),
    PlantedBug(
        "sched-min-tokens-off-by-one", "scheduler", FOLDING,
        "        if num_out >= p.min_tokens:\n",
        "        if num_out > p.min_tokens:\n",
        (f"{T_PLANNER}::test_min_tokens_lets_a_stop_token_end_the_request_from_the_min_tokens_th"
         "_output", T_SIM),
        "an EOS or stop token sampled exactly at min_tokens does not end the output, which "
        "runs on one token (or to max_tokens) past where it should stop",
    ),
    # --- tiers ---------------------------------------------------------------------------------
    PlantedBug(
        "tiers-disk-read-before-write-done", "tiers", KV_TIERS,
        "        self.writer.wait(pages)\n",
        "",
        (T_KV_TIERS,),
        "a page moved up from disk is read before its write to the disk finished, so the "
        "request gets stale or zero KV and answers garbage",
    ),
    PlantedBug(
        "tiers-old-pages-freed-in-new-tier", "tiers", TIER_MOVER,
        "        self.free([(src, old)])\n",
        "        self.free([(tier, old)])\n",
        (T_TIER_MOVER,),
        "a page moved between tiers is freed in the pool it moved to instead of the one it "
        "left, leaking one tier and double-freeing the other",
    ),
    PlantedBug(
        "tiers-loading-path-demoted", "tiers", TIER_MOVER,
        "if id(n) not in self._loading),\n",
        "if n is not None),\n",
        (T_TIER_MOVER,),
        "making room in a lower tier may move down the very prefix being loaded back up, so "
        "the load-back half-finishes and the request recomputes it",
    ),
    PlantedBug(
        "tiers-node-size-off-by-one", "tiers", TIER_MOVER,
        "            if len(node.pages) <= self.pool(tier).num_pages:\n",
        "            if len(node.pages) < self.pool(tier).num_pages:\n",
        (T_TIER_MOVER,),
        "a prefix exactly the size of the host tier skips it and goes to disk (or is dropped), "
        "so its reload is slow or a recompute",
    ),
    PlantedBug(
        "tiers-torn-disk-data-trusted", "tiers", DISK_FORMAT,
        "            if zlib.crc32(os.pread(fd, geo.page_bytes, geo.data_offset_of(page))) != "
        "data_crc:\n"
        "                continue  # torn data, or the page's next occupant was being written\n",
        "",
        (T_DISK,),
        "a warm restart trusts a disk page's record without checking its data's CRC, so a "
        "page torn by a kill is served as KV and the answers are garbage",
    ),
    PlantedBug(
        "tiers-hit-counted-after-move", "tiers", TIER_MOVER,
        "                self.stats.hit_tokens[node.tier] += len(node.key)\n"
        "                self._move(node, DEVICE_TIER, pages)\n",
        "                self._move(node, DEVICE_TIER, pages)\n"
        "                self.stats.hit_tokens[node.tier] += len(node.key)\n",
        (T_TIER_MOVER, T_KV),
        "tokens loaded back from host or disk are counted as device hits, so the tier "
        "metrics say the lower tiers never serve anything",
    ),
)
