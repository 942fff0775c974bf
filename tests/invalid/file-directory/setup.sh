rm model.json && mkdir model.json
