"""``workbench monitor``: the live view of a run, and the alerts that say what broke.

    status   the thresholds, the server's state and each dataset's status
    alerts   the alerts of one frame
    render   a frame drawn as text or with rich, fitted to the terminal
    fit      one line fitted to a width: shorter phrases, parts given up, never wrapped
    turns    datasets regenerated turn by turn: turns done, conversations, early ends
    modes    datasets that mix modes: each mode's share written against wanted
    monitor  the polling loop and the command
"""
