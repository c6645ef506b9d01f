-- Surge for Slurm's burst_buffer/lua plugin (Slurm 22.05+): every hook runs one
-- `surge bb <phase>` command, which does the phase against the Surge manager. DataWarp job
-- scripts (#DW jobdw, #DW stage_in, #DW stage_out, #DW persistentdw, #BB create_persistent,
-- #BB destroy_persistent) run unchanged.
--
-- Install: copy this file next to slurm.conf with burst_buffer.conf (Directive=DW), set
-- BurstBufferType=burst_buffer/lua in slurm.conf, and edit the three settings below.
-- The hooks run as SlurmUser inside slurmscriptd on the controller: SlurmUser must be able to
-- run SURGE and its primary group must be the manager's --admin-group (it acts for the jobs'
-- owners, authenticated by MUNGE). See contrib/slurm/README.md.

-- The `surge` executable.
local SURGE = "@SURGE@"
-- The Surge manager's gRPC address.
local MANAGER = "@MANAGER@"
-- slurm.conf, for the squeue/scontrol calls that learn a job's nodes and working directory.
local SLURM_CONF = "@SLURM_CONF@"
-- Where `surge bb reconcile` (started by the periodic pools hook) logs the sessions it ends.
local RECONCILE_LOG = "@RECONCILE_LOG@"

local function q(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs a shell command; returns ok, its output (stdout and stderr), and how long it took in
-- ms. The exit status is read from the output: Lua 5.1's close() of a pipe does not give it.
local function sh(cmd)
	local p = io.popen("t0=$(date +%s%N); (" .. cmd .. ") 2>&1; rc=$?; "
		.. "echo \"surge-ms=$(( ($(date +%s%N) - t0) / 1000000 )) surge-exit=$rc\"")
	if not p then
		return false, "cannot run " .. cmd, 0
	end
	local out = p:read("*a") or ""
	p:close()
	local ms, code = out:match("surge%-ms=(%d+) surge%-exit=(%d+)%s*$")
	out = out:gsub("surge%-ms=%d+ surge%-exit=%d+%s*$", ""):gsub("%s+$", "")
	return code == "0", out, tonumber(ms) or 0
end

local function surge(phase, job_id, job_script, extra)
	local cmd = SURGE .. " bb " .. phase
	if phase ~= "validate" then
		cmd = cmd .. " --manager " .. q(MANAGER)
	end
	if job_id then
		cmd = cmd .. " --job-id " .. q(job_id) .. " --script " .. q(job_script)
	end
	if extra then
		cmd = cmd .. " " .. extra
	end
	local ok, out, ms = sh(cmd)
	if ok then
		slurm.log_info("surge bb %s job=%s (%d ms): %s", phase, tostring(job_id), ms, out)
		return slurm.SUCCESS, out
	end
	slurm.log_error("surge bb %s job=%s failed (%d ms): %s", phase, tostring(job_id), ms, out)
	return slurm.ERROR, out
end

-- A field of `squeue -j JOB -o FORMAT` (e.g. %N nodes, %D node count, %Z working directory).
local function job_field(job_id, format)
	local ok, out = sh("SLURM_CONF=" .. q(SLURM_CONF) .. " squeue -h -j " .. q(job_id) .. " -o " .. q(format))
	if ok then
		return out
	end
	return nil
end

local function job_hosts(job_id)
	local list = job_field(job_id, "%N")
	if not list or list == "" then
		return nil
	end
	local ok, out = sh("SLURM_CONF=" .. q(SLURM_CONF) .. " scontrol show hostnames " .. q(list))
	if not ok then
		return nil
	end
	local hosts = {}
	for h in out:gmatch("%S+") do
		hosts[#hosts + 1] = h
	end
	return table.concat(hosts, ",")
end

-- At sbatch time: the script's directives are parsed by Surge; errors name the line.
function slurm_bb_job_process(job_script)
	local script = job_script
	local f = io.open(job_script, "r")
	if f then
		f:close()
	else
		-- Given the script's text: parse a copy.
		script = os.tmpname()
		local w = io.open(script, "w")
		w:write(job_script)
		w:close()
	end
	local rc, out = surge("validate", nil, nil, "--name 'batch script' " .. q(script))
	if script ~= job_script then
		os.remove(script)
	end
	return rc, out
end

-- Ends the Surge sessions of jobs Slurm forgot or ended during stage-in (Slurm calls no
-- teardown for those). In the background, one at a time (flock on the log): this hook is
-- called with slurmctld's locks held, and reconcile runs squeue.
local function reconcile_in_background()
	local cmd = "SLURM_CONF=" .. q(SLURM_CONF) .. " " .. SURGE .. " bb reconcile --manager " .. q(MANAGER)
	os.execute("setsid -f flock -n " .. q(RECONCILE_LOG) .. " sh -c "
		.. q("{ date; " .. cmd .. "; } >> " .. q(RECONCILE_LOG) .. " 2>&1")
		.. " < /dev/null > /dev/null 2>&1")
end

-- Called at start and every 30 s by slurmctld.
function slurm_bb_pools()
	reconcile_in_background()
	local rc, out = surge("pools")
	if rc ~= slurm.SUCCESS then
		return rc, out
	end
	return slurm.SUCCESS, out
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	local nodes = job_field(job_id, "%D") or "1"
	if not nodes:match("^%d+$") then
		nodes = "1"
	end
	return surge("setup", job_id, job_script,
		"--uid " .. q(uid) .. " --gid " .. q(gid) .. " --nodes " .. q(nodes))
end

function slurm_bb_data_in(job_id, job_script)
	local wd = job_field(job_id, "%Z") or "/"
	return surge("data_in", job_id, job_script, "--workdir " .. q(wd))
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	return surge("paths", job_id, job_script, "--path-file " .. q(path_file))
end

function slurm_bb_pre_run(job_id, job_script)
	local hosts = job_hosts(job_id)
	if not hosts then
		return slurm.ERROR, "cannot learn the nodes of job " .. tostring(job_id)
	end
	return surge("pre_run", job_id, job_script, "--hosts " .. q(hosts))
end

function slurm_bb_post_run(job_id, job_script)
	return surge("post_run", job_id, job_script)
end

function slurm_bb_data_out(job_id, job_script)
	local wd = job_field(job_id, "%Z") or "/"
	return surge("data_out", job_id, job_script, "--workdir " .. q(wd))
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	local extra = nil
	if hurry == true or hurry == "true" then
		extra = "--hurry"
	end
	return surge("teardown", job_id, job_script, extra)
end

-- `scontrol show bbstat` / `scrontrol show burstbuffer`: Surge's own view.
function slurm_bb_get_status(...)
	local ok, out = sh(SURGE .. " session --manager " .. q(MANAGER) .. " ls")
	if ok then
		return slurm.SUCCESS, out .. "\n"
	end
	return slurm.ERROR, out
end
