"""The server as the workbench sees it: SGLang, the simulator, or sglang-router in front.

    client   the SGLang HTTP client (/generate, /server_info, /metrics, ...), errors mapped
             onto the exception tree
    metrics  /metrics (Prometheus text) and the scheduler's log lines
    launch   server processes (SGLang or the simulator) as a process group
"""
