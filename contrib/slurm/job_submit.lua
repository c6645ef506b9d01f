-- Surge for Slurm's job_submit/lua plugin (Slurm 22.05+): DataWarp job scripts written for
-- Cray's Slurm plugin, which took the site's DefaultPool, run unchanged under burst_buffer/lua.
--
-- Why: burst_buffer/lua refuses a `#DW` line with `capacity=` and no `pool=` ("Must specify
-- pool with capacity for burst buffer", sbatch: "Burst Buffer request invalid") and ignores
-- DefaultPool in burst_buffer.conf ("DefaultPool is unused for this plugin, unsetting"). NERSC's
-- and KAUST's scripts never named a pool. job_submit/lua runs in slurmctld before the burst
-- buffer plugin reads the script (validate_job_create_req, then job_allocate), so here:
--
--   1. the script's directives are checked by `surge bb validate`: a bad one is refused at
--      sbatch with Surge's message, naming the line and the value (`batch script:3: ...
--      access_mode 'stripd' ... did you mean 'striped'?`), before Slurm's own terser parse;
--   2. each `#DW jobdw` / `#DW create_persistent` directive with `capacity=` and no `pool=` gets
--      ` pool=DEFAULT_POOL` appended (on its last line when it is continued with `\`), in the
--      script and in `--bb` text. Nothing else is changed; lines keep their numbers.
--
-- HPE Rabbit (DWS) scripts go the same way: each `#DW jobdw type=xfs|gfs2|lustre capacity=...
-- name=...` gets the default pool (Surge takes `pool=` on them as its own key, and Rabbit
-- scripts never name one), `#DW copy_in` / `#DW copy_out` have no capacity and are left alone,
-- and what Surge does not do (`type=raw`, `#DW container`, `profile=`) is refused here with
-- Surge's message (docs/DIRECTIVES.md, "HPE Rabbit").
--
-- Install: copy next to slurm.conf as job_submit.lua, set JobSubmitPlugins=lua in slurm.conf,
-- and edit the settings below. A site that already has a job_submit.lua: copy everything above
-- "The plugin's entry points" into it and call surge_job_submit(job_desc) first in its
-- slurm_job_submit. slurmctld reads the file again when it changes.

-- The `surge` executable (slurmctld runs it as SlurmUser).
local SURGE = "@SURGE@"
-- The pool a `#DW` capacity without `pool=` is allocated from (DataWarp's DefaultPool).
local DEFAULT_POOL = "@DEFAULT_POOL@"
-- burst_buffer.conf's Directive (the prefix of the lines Slurm hands to burst_buffer/lua).
local DIRECTIVE = "DW"

-- ESLURM_INVALID_BURST_BUFFER_REQUEST ("Burst Buffer request invalid"), the code
-- burst_buffer/lua itself refuses a bad request with (2094 in Slurm 22.05 to 24.x; the Lua
-- table of job_submit/lua does not export it).
local INVALID_BB_REQUEST = 2094

local function q(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs a shell command; returns ok and its output (stdout and stderr). The exit status is read
-- from the output: Lua 5.1's close() of a pipe does not give it.
local function sh(cmd)
	local p = io.popen("(" .. cmd .. ") 2>&1; echo \"surge-exit=$?\"")
	if not p then
		return false, "cannot run " .. cmd
	end
	local out = p:read("*a") or ""
	p:close()
	local code = out:match("surge%-exit=(%d+)%s*$")
	out = out:gsub("surge%-exit=%d+%s*$", ""):gsub("%s+$", "")
	return code == "0", out
end

-- The lines of a text, each without its "\n"; a final line without one is kept.
local function lines_of(text)
	local lines = {}
	local start = 1
	while start <= #text do
		local nl = text:find("\n", start, true)
		if not nl then
			lines[#lines + 1] = text:sub(start)
			break
		end
		lines[#lines + 1] = text:sub(start, nl - 1)
		start = nl + 1
	end
	return lines, text:sub(-1) == "\n"
end

-- True when the comment block at the top of `text` (where Slurm and Surge read directives)
-- has a `#DW` or `#BB` line: only then is Surge asked anything.
local function has_directives(text)
	for _, line in ipairs((lines_of(text))) do
		if line ~= "" then
			if line:sub(1, 1) ~= "#" then
				return false
			end
			if line:match("^#DW") or line:match("^#BB") or line:match("^#" .. DIRECTIVE) then
				return true
			end
		end
	end
	return false
end

-- Appends " pool=DEFAULT_POOL" to each `#DW jobdw` / `#DW create_persistent` directive of the
-- header that has `capacity=` and no `pool=` (read as burst_buffer/lua reads them: up to the
-- first line that is not a comment, blank lines skipped, `\` continuing a directive on the
-- next `#DW` line). Returns the new text and how many directives were given the pool.
local function add_default_pool(text)
	local lines, final_nl = lines_of(text)
	local prefix = "#" .. DIRECTIVE
	local group = {} -- indexes of the physical lines of the directive being read
	local changed = 0
	local function finish()
		if #group == 0 then
			return
		end
		local parts = {}
		for _, i in ipairs(group) do
			parts[#parts + 1] = lines[i]
		end
		local joined = table.concat(parts, " ")
		local verb = lines[group[1]]:sub(#prefix + 1):match("^%s*(%S+)")
		if (verb == "jobdw" or verb == "create_persistent")
			and joined:find("capacity=", 1, true) and not joined:find("pool=", 1, true) then
			local last = group[#group]
			lines[last] = lines[last]:gsub("%s*$", "") .. " pool=" .. DEFAULT_POOL
			changed = changed + 1
		end
		group = {}
	end
	for i, line in ipairs(lines) do
		if line ~= "" then
			if line:sub(1, 1) ~= "#" then
				break
			end
			if line:sub(1, #prefix) == prefix then
				group[#group + 1] = i
				if not line:match("\\%s*$") then
					finish()
				end
			else
				finish()
			end
		end
	end
	finish()
	if changed == 0 then
		return text, 0
	end
	local out = table.concat(lines, "\n")
	if final_nl then
		out = out .. "\n"
	end
	return out, changed
end

-- The script as burst_buffer/lua reads it: `--bb` text goes after the script's first line
-- when that is a comment (the #! line), else before it (Slurm's run_command_add_to_script).
local function with_bb_text(script, bb)
	if not bb or bb == "" then
		return script
	end
	if bb:sub(-1) ~= "\n" then
		bb = bb .. "\n"
	end
	if not script or script == "" then
		return bb
	end
	if script:sub(1, 1) ~= "#" then
		return bb .. script
	end
	local nl = script:find("\n", 1, true)
	if not nl then
		return script .. "\n" .. bb
	end
	return script:sub(1, nl) .. bb .. script:sub(nl + 1)
end

-- `surge bb validate` on the text; returns ok and Surge's message.
local function validate(text)
	local path = os.tmpname()
	local f = io.open(path, "w")
	if not f then
		return false, "surge: cannot write a copy of the job script to " .. path
	end
	f:write(text)
	f:close()
	local ok, out = sh(SURGE .. " bb validate --name 'batch script' " .. q(path))
	os.remove(path)
	return ok, out
end

-- Checks the burst-buffer directives of a submission and gives `capacity=` without `pool=`
-- the default pool. Returns slurm.SUCCESS, or INVALID_BB_REQUEST with Surge's message given
-- to the user (sbatch prints it).
function surge_job_submit(job_desc)
	local script = job_desc.script
	local bb = job_desc.burst_buffer
	local has_script = script and script ~= "" and has_directives(script)
	local has_bb = bb and bb ~= ""
	if not has_script and not has_bb then
		return slurm.SUCCESS
	end
	local ok, out = validate(with_bb_text(script, bb))
	if not ok then
		slurm.log_info("surge job_submit: refused a submission by uid %s: %s",
			tostring(job_desc.user_id), out)
		slurm.log_user("%s", out)
		return INVALID_BB_REQUEST
	end
	if has_script then
		local s, n = add_default_pool(script)
		if n > 0 then
			job_desc.script = s
			slurm.log_info("surge job_submit: pool=%s added to %d directive(s) of a script of uid %s",
				DEFAULT_POOL, n, tostring(job_desc.user_id))
		end
	end
	if has_bb then
		-- `--bb` text may lack the `#DW` prefix on continuation-free one-liners only by mistake;
		-- Slurm ignores such text, so only prefixed lines are completed.
		local s, n = add_default_pool(bb)
		if n > 0 then
			job_desc.burst_buffer = s
		end
	end
	return slurm.SUCCESS
end

-- The plugin's entry points.

function slurm_job_submit(job_desc, part_list, submit_uid)
	return surge_job_submit(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
